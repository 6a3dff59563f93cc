"""Layer 0, what a job is given: the typed config (``config``), EAGLE-3 drafter rules (``drafter``),
prompt sets (``prompts``) and drafter training lineage (``lineage``). Imports no other layer."""
