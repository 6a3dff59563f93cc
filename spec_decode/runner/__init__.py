"""Floor 3, the measuring side: the job (``job``), preflight and the doctor, the HTTP client, the paired
baseline, the load and request passes, the profiled pass, the GPU-slot allocator (the server process itself
lives in ``engines``)."""
