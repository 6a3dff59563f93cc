"""Layer 3, the measuring side: the job (``job``, ``cli``), preflight and the doctor, the server process
and its HTTP client, the paired baseline, the request pass, the GPU-slot allocator."""
