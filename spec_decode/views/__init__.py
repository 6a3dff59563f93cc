"""Layer 4, the views that read records: MLflow (``tracking``), the sweep callback (``sweep``), reports
and charts, and the DVC experiment stages (``experiment``, ``drafter_experiments``)."""
