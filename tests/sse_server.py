"""A scripted /generate server that streams SSE like SGLang 0.5.23 (for tests only: a process-boundary
double of the inference server, for the client's parser and timing rules).

    python tests/sse_server.py <plan.json>        prints "port <N>" once listening on 127.0.0.1

The plan (JSON):
  chunks        [[delay_ms, n_tokens], ...]  each chunk is sent delay_ms after the previous one
  ids           "cumulative" (SGLang's default) | "incremental" (--stream-output) | "none"
  framing       "chunked" (HTTP/1.1 Transfer-Encoding: chunked, as uvicorn) | "close" (no length,
                the body ends with the connection)
  content_type  default "text/event-stream"
  error_after   k: after k chunks send SGLang's mid-stream error chunk instead of the rest
  no_done       true: end the stream without `data: [DONE]`
  meta          extra keys of the final chunk's meta_info (spec counters, e2e_latency)
  bodies        a file to which every request body is appended as a JSON line
Token i of the output has id 100 + i % 50. A non-stream request gets the whole answer at once.
"""

from __future__ import annotations

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def token_id(i: int) -> int:
    return 100 + i % 50


def main() -> None:
    plan = json.loads(open(sys.argv[1]).read())
    chunks = plan["chunks"]
    total = sum(n for _, n in chunks)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # each chunk leaves at once, like uvicorn's

        def log_message(self, fmt, *args):
            pass

        def do_POST(self):  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if plan.get("bodies"):
                with open(plan["bodies"], "a") as f:
                    f.write(json.dumps(body) + "\n")
            final_meta = {"prompt_tokens": 7, "completion_tokens": total, **plan.get("meta", {})}
            if not body.get("stream"):
                data = json.dumps(
                    {"text": "x" * total, "output_ids": [token_id(i) for i in range(total)], "meta_info": final_meta}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            chunked = plan.get("framing", "chunked") == "chunked"
            self.send_response(200)
            self.send_header("Content-Type", plan.get("content_type", "text/event-stream"))
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()

            def send(payload: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload) if chunked else payload)
                self.wfile.flush()

            done = 0
            for k, (delay_ms, n) in enumerate(chunks):
                time.sleep(delay_ms / 1e3)
                if plan.get("error_after") is not None and k == plan["error_after"]:
                    send(b'data: {"error": {"message": "injected failure"}}\n\n')
                    break
                ids = {
                    "cumulative": [token_id(i) for i in range(done + n)],
                    "incremental": [token_id(i) for i in range(done, done + n)],
                }.get(plan.get("ids", "cumulative"))
                done += n
                meta = {"prompt_tokens": 7, "completion_tokens": done}
                if k == len(chunks) - 1:
                    meta = final_meta
                out = {"text": "x" * done, "meta_info": meta}
                if ids is not None:
                    out["output_ids"] = ids
                send(b"data: " + json.dumps(out).encode() + b"\n\n")
            if not plan.get("no_done"):
                send(b"data: [DONE]\n\n")
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    print(f"port {httpd.server_address[1]}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
