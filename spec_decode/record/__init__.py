"""Floor 1, the record: its types and its one write and read (``results``: JobRecord, ``write``, ``read``,
``collect``; the section types in ``sections``, ``measured``, ``load``, ``payloads``, ``provenance``, ``runs``,
``outputs``; ``typed``: what they share). No derived number is computed here (docs/architecture.md)."""
