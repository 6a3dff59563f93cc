"""The NCCL all-reduce probe (``nccl``): standalone or run by a job before its server starts."""
