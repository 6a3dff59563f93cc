"""The static path's shapes: their buffers and the functions that a CUDA graph captures (graphs.py's
``StaticRunner`` runs them; its docstring lists the shapes).

Each shape reads and writes its own buffers, except where a cycle's phases hand over on the device: the
``extend`` shape of a bucket reads the ``verify`` shape's buffers of that bucket in place (its slots,
predictions, features, positions and committed counts), so nothing is copied between the two on the
host's behalf. The positions of ``verify`` and ``draft`` come from each slot's committed length on the
device (``tlen``) inside the shape, and ``verify`` advances ``tlen`` by the committed counts inside it too:
what the host issues per cycle is its replays, the few inputs it owns (slots, the last and draft tokens,
forced counts) and the copies of what it keeps (SGLang's EAGLE worker likewise prepares a verify's and a
draft-extend's inputs in device kernels).
"""

from __future__ import annotations

import torch


class ShapeFunctions:
    """Mixed into StaticRunner: ``_add_bucket`` makes bucket b's shapes; ``_decode`` ... ``_extend`` are
    what runs (eagerly, compiled, or captured) on a shape's buffers ``b``."""

    proj_split = 0  # StaticRunner's: o/down as fp32 partials (compiled only)

    def _add_bucket(self, b: int) -> None:
        dev, h, k = self.device, self.target.shape.hidden_size, self.k
        long, f = dict(dtype=torch.long, device=dev), dict(device=dev)
        if self.drafter is None:
            self._add(
                f"decode@{b}",
                b,
                1,
                {"ids": torch.zeros(1, b, **long), "pos": torch.zeros(b, **long), "tok": torch.zeros(b, **long)},
                self._decode,
            )
            return
        t, width = k + 1, len(self.capture_ids) * h
        verify = {
            "ids": torch.zeros(1, b * t, **long),
            "pos": torch.zeros(b * t, **long),
            "pred": torch.zeros(b, t, **long),
            "accepted": torch.zeros(b, **long),  # the verified counts
            "forced": torch.zeros(b, **long),  # forced acceptance's counts (from the host)
            "use_forced": torch.zeros(1, dtype=torch.bool, device=dev),
            "rows": torch.zeros(b, **long),  # the committed counts (padding rows: 0)
            "aux": torch.zeros(1, b * t, width, **f),
        }
        self._add(f"verify@{b}", b, t, verify, self._verify)
        if k > 1:  # steps 1 drafts nothing past the re-extend's first token
            self._add(
                f"draft@{b}",
                b,
                1,
                {
                    "tok": torch.zeros(1, b, **long),
                    "h": torch.zeros(1, b, h, **f),
                    "next": torch.zeros(b, k - 1, **long),
                },
                self._draft,
            )
        extend = {key: verify[key] for key in ("slots", "pred", "aux", "pos", "rows")}  # the verify's, in place
        extend |= {"first": torch.zeros(b, **long), "h_out": torch.zeros(1, b, h, **f)}
        self._add(f"extend@{b}", b, t, extend, self._extend)

    def _add(self, name: str, b: int, t: int, bufs: dict, fn) -> None:
        if "slots" not in bufs:
            bufs["slots"] = torch.full((b,), self.scratch, dtype=torch.long, device=self.device)
        bufs["trows"] = self.tcache.rows(bufs["slots"], t)
        if self.dcache is not None:
            bufs["drows"] = self.dcache.rows(bufs["slots"], t)
        self.bufs[name] = bufs
        run = lambda: fn(bufs)  # noqa: E731
        if self.compile:  # no autograd graph to trace (a caller outside no_grad: the weights require grad)
            run = torch.compile(torch.no_grad()(run), fullgraph=True, dynamic=False, backend=self.compile_backend)
        self.fns[name] = run

    def _starts(self, b) -> torch.Tensor:
        """Each row's committed target length (padding rows: the scratch slot's, 0)."""
        return self.tlen.index_select(0, b["slots"])

    def _decode(self, b) -> None:
        logits, _ = self.target.forward_static(
            b["ids"], b["pos"], b["trows"], rot_rows=not self.compile, dense=self.compile, split=self.proj_split
        )
        b["tok"].copy_(logits.argmax(-1))

    def _verify(self, b) -> None:
        t = self.k + 1
        b["pos"].view(-1, t).copy_(self._starts(b)[:, None] + self.arange[:t])
        logits, aux = self.target.forward_static(
            b["ids"],
            b["pos"],
            b["trows"],
            self.capture_ids,
            rot_rows=not self.compile,
            dense=self.compile,
            split=self.proj_split,
        )
        pred = logits.argmax(-1).view(b["pred"].shape)
        b["pred"].copy_(pred)
        drafts = b["ids"].view(b["pred"].shape)[:, 1:]
        b["accepted"].copy_((drafts == pred[:, : self.k]).to(torch.int32).cumprod(1).sum(1))
        b["aux"].copy_(aux)
        # The committed counts advance each slot's length here, on the device: no host read (padding rows
        # hold the scratch slot, whose length stays 0)
        real = b["slots"] != self.scratch
        rows = torch.where(real, torch.where(b["use_forced"], b["forced"], b["accepted"]), 0)
        b["rows"].copy_(rows)
        self.tlen.index_add_(0, b["slots"], torch.where(real, rows + 1, 0))

    def _draft(self, b) -> None:
        tok, h, pos = b["tok"], b["h"], self._starts(b)  # the drafter's length is the target's here
        for j in range(self.k - 1):  # unrolled: the chain is one graph (and one compiled function)
            dl, h = self.drafter.forward_static(tok, h, pos + j, b["drows"], rot_rows=not self.compile)
            nxt = self.drafter.to_target_ids(dl.argmax(-1))
            b["next"][:, j].copy_(nxt)
            tok = nxt.view(1, -1)

    def _extend(self, b) -> None:
        t = self.k + 1
        last = self.arange[: b["rows"].shape[0]] * t + b["rows"]  # each row's last committed index
        dl, dh = self.drafter.forward_static(
            b["pred"].view(1, -1), b["aux"], b["pos"], b["drows"], rot_rows=not self.compile
        )
        b["first"].copy_(self.drafter.to_target_ids(dl.index_select(0, last).argmax(-1)))
        b["h_out"].copy_(dh.index_select(1, last))
