"""``python -m spec_decode.tracking sync DIR``: the device runs' results (tracking=off) into MLflow.

The name the team's runbooks use for ``python -m spec_decode sync DIR`` (``spec_decode.views.tracking``,
where the upload lives); a command module above the floors, as ``bench``.
"""

from spec_decode.views.tracking import main

if __name__ == "__main__":
    main(prog="python -m spec_decode.tracking")
