"""Layer 2, the record: ``results`` (JobRecord, JobContext, ``finish``, the one write of results.json,
``collect``) and ``provenance`` (git, packages, the live server environment, hashes)."""
