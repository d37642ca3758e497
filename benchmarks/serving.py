"""The service on loopback: /predict latency, throughput with 2 workers, cold graph upload.

    .venv/bin/python benchmarks/serving.py [--requests 1000] [--layers 16]

- latency: p50/p99 of POST /predict for an uploaded (cached) graph id with 8 configs,
  sequential requests on one keep-alive connection, 1 uvicorn worker (target p50 <= 5 ms),
  from a raw socket (server time plus loopback) and from httpx (what a Python user sees);
- throughput: requests/s of the same request with 2 uvicorn workers, from 2 client
  processes with 8 keep-alive connections each (a raw HTTP/1.1 load generator, like wrk,
  so the client takes little CPU; target >= 300/s); client and server share the CPUs;
- cold upload: POST /graphs of a fresh ~5k-node graph (GPT-2 with 16 blocks, captured once
  into $MEMGNN_CACHE): decompression, validation, encoding and a durable store write.
The server processes' CPU time per request is reported too: on a shared machine it is the
figure that other load does not inflate much (capacity ~ 1000 / that per dedicated core).
Writes benchmarks/results/serving.json and .md. Bounded request counts; stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import logging
import multiprocessing as mp
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from memgnn.serving.client import free_port
from results_io import write_results

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [
    {"sizes": {"B": b, "S": 512}, "device": "h100-80gb"} for b in (1, 2, 4, 8, 16, 32, 64, 128)
]


# what every /predict body adds (`--method`): the server routes `auto` by its budget
EXTRA: dict = {}


def start_server(state: Path, workers: int, model: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "memgnn.cli",
        "serve",
        "--port",
        str(port),
        "--model",
        model,
        "--state-dir",
        str(state),
        "--workers",
        str(workers),
        "--log-level",
        "warning",
        "--allow-anonymous-writes",  # loopback only, its own state folder
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not become ready in 120 s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its descendants (Linux /proc)."""
    total, todo = 0.0, [pid]
    tick = os.sysconf("SC_CLK_TCK")
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue
    return total


def graph_blob(layers: int) -> tuple[dict, int]:
    from memgnn.predictor.capture.cache import capture_cached
    from memgnn.predictor.spec.train import TrainSpec
    from memgnn.predictor.zoo import make_bundle

    bundle = make_bundle("gpt2", {"layers": layers, "hidden": 768, "heads": 12})
    graph = capture_cached(bundle, TrainSpec(), target="cuda", sm=90)
    data = graph.content() | {"meta": graph.meta}
    return data, sum(p.num_nodes for p in graph.paths)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def cold_uploads(url: str, data: dict, n: int) -> dict:
    times, sizes = [], []
    with httpx.Client(base_url=url, timeout=60) as c:
        for i in range(n):
            fresh = data | {"model": data["model"] | {"bench_nonce": f"{time.time_ns()}-{i}"}}
            blob = gzip.compress(json.dumps(fresh, separators=(",", ":")).encode())
            t0 = time.perf_counter()
            r = c.post(
                "/graphs",
                content=blob,
                headers={"content-type": "application/json", "content-encoding": "gzip"},
            )
            times.append(time.perf_counter() - t0)
            r.raise_for_status()
            assert r.json()["stored"], r.text
            sizes.append(len(blob))
    return {
        "n": n,
        "gzip_bytes": sizes[0],
        "p50_ms": 1e3 * statistics.median(times),
        "max_ms": 1e3 * max(times),
        "first_ms": 1e3 * times[0],
    }


def _request_bytes(gid: str) -> bytes:
    body = json.dumps({"graph_id": gid, "configs": CONFIGS, **EXTRA}).encode()
    head = (
        "POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _raw_timings(url: str, gid: str, n: int) -> list[float]:
    """Sequential requests on one keep-alive socket, with next to no client work."""
    req = _request_bytes(gid)
    port = int(url.rsplit(":", 1)[1])
    times = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for i in range(n + 50):
            t0 = time.perf_counter()
            sock.sendall(req)
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += sock.recv(65536)
            head, rest = buf.split(b"\r\n\r\n", 1)
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            while len(rest) < length:
                rest += sock.recv(65536)
            dt = time.perf_counter() - t0
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode(errors="replace"))
            if i >= 50:
                times.append(dt)
    return times


def _httpx_timings(url: str, gid: str, n: int) -> list[float]:
    body = {"graph_id": gid, "configs": CONFIGS, **EXTRA}
    times = []
    with httpx.Client(base_url=url, timeout=30) as c:
        for i in range(n + 50):
            t0 = time.perf_counter()
            r = c.post("/predict", json=body)
            dt = time.perf_counter() - t0
            r.raise_for_status()
            if i >= 50:
                times.append(dt)
    return times


def latency(url: str, gid: str, n: int) -> dict:
    out: dict = {"requests": n, "configs_per_request": len(CONFIGS)}
    for name, fn in (("raw_socket", _raw_timings), ("httpx", _httpx_timings)):
        times = fn(url, gid, n)
        out[name] = {
            "p50_ms": 1e3 * statistics.median(times),
            "p99_ms": 1e3 * pct(times, 0.99),
            "mean_ms": 1e3 * statistics.fmean(times),
        }
    return out


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes) -> int:
    """One keep-alive HTTP/1.1 request/response; the status code."""
    writer.write(req)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return int(head[9:12])


def _client(port: int, gid: str, n: int, conns: int, queue: mp.Queue) -> None:
    """A light load generator (raw keep-alive HTTP/1.1, like wrk) so that the client
    spends little of the CPUs it shares with the server."""
    req = _request_bytes(gid)

    async def worker(k: int) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        ok = 0
        for _ in range(k):
            ok += await _exchange(reader, writer, req) == 200
        writer.close()
        return ok

    async def run() -> int:
        return sum(await asyncio.gather(*(worker(n // conns) for _ in range(conns))))

    queue.put(asyncio.run(run()))


def throughput(url: str, gid: str, total: int, procs: int = 2, conns: int = 8) -> dict:
    with httpx.Client(base_url=url, timeout=30) as c:  # warm both workers' caches
        for _ in range(40):
            body = {"graph_id": gid, "configs": CONFIGS, **EXTRA}
            c.post("/predict", json=body).raise_for_status()
    queue: mp.Queue = mp.Queue()
    per = total // procs
    port = int(url.rsplit(":", 1)[1])
    workers = [
        mp.Process(target=_client, args=(port, gid, per, conns, queue)) for _ in range(procs)
    ]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    done = sum(queue.get(timeout=600) for _ in workers)
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    if done != procs * (per // conns) * conns:
        raise RuntimeError(f"only {done} requests answered 200")
    return {
        "workers": 2,
        "client_processes": procs,
        "connections": procs * conns,
        "requests": done,
        "seconds": wall,
        "requests_per_s": done / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--throughput-requests", type=int, default=4000)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument(
        "--model", default="default", help="what the server answers with: default | analytic"
    )
    ap.add_argument(
        "--method", default=None, choices=("auto", "replay", "gnn", "analytic"),
        help="the request's method (default: none sent, the server's auto)",
    )  # fmt: skip
    args = ap.parse_args()
    argv = sys.argv[1:]
    if args.method:
        EXTRA["method"] = args.method
    logging.basicConfig(level=logging.WARNING)
    t0 = time.perf_counter()
    data, n_nodes = graph_blob(args.layers)
    capture_s = time.perf_counter() - t0
    result: dict = {
        "graph": {
            "model": f"gpt2 {args.layers} blocks, hidden 768",
            "nodes": n_nodes,
            "capture_or_cache_s": round(capture_s, 2),
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_before": [round(x, 2) for x in os.getloadavg()],
        },
        "model": args.model,
        "args": "".join(f" {a}" for a in argv),
    }
    with tempfile.TemporaryDirectory() as state:
        proc, url = start_server(Path(state) / "one", 1, args.model)
        try:
            result["cold_upload"] = cold_uploads(url, data, 5)
            blob = gzip.compress(json.dumps(data).encode())
            gid = httpx.post(f"{url}/graphs", content=blob, timeout=60).json()["graph_id"]
            body = {"graph_id": gid, "configs": CONFIGS, **EXTRA}
            first = httpx.post(f"{url}/predict", json=body, timeout=60).json()
            result["model"] = f"{args.model}: {first['model_version']}"
            result["route"] = {"asked": args.method or "auto (not sent)",
                               "ran": first["predictions"][0]["method"]}  # fmt: skip
            cpu0 = cpu_seconds(proc.pid)
            result["predict_latency"] = latency(url, gid, args.requests)
            served = 2 * (args.requests + 50)
            result["predict_latency"]["server_cpu_ms_per_request"] = (
                1e3 * (cpu_seconds(proc.pid) - cpu0) / served
            )
        finally:
            stop(proc)
        proc, url = start_server(Path(state) / "two", 2, args.model)
        try:
            gid = httpx.post(f"{url}/graphs", content=blob, timeout=60).json()["graph_id"]
            cpu0 = cpu_seconds(proc.pid)
            result["throughput"] = throughput(url, gid, args.throughput_requests)
            thr = result["throughput"]
            thr["server_cpu_ms_per_request"] = (
                1e3 * (cpu_seconds(proc.pid) - cpu0) / (thr["requests"] + 40)
            )
        finally:
            stop(proc)
    result["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    result["targets"] = {
        "predict_p50_ms<=5": result["predict_latency"]["raw_socket"]["p50_ms"] <= 5,
        "throughput_rps>=300": result["throughput"]["requests_per_s"] >= 300,
    }
    name = "serving" + ("" if args.model == "default" else f"_{args.model}")
    write_results(name + (f"_{args.method}" if args.method else ""), result, markdown(result))
    sys.stdout.write(markdown(result))


def markdown(r: dict) -> str:
    lat, thr, up = r["predict_latency"], r["throughput"], r["cold_upload"]
    return "\n".join(
        [
            "# serving benchmark (loopback)",
            "",
            f"Graph: {r['graph']['model']}, {r['graph']['nodes']} nodes; model {r['model']}; "
            f"method asked {r['route']['asked']}, answered by {r['route']['ran']}; "
            f"{r['machine']['cpus']} CPUs shared by client and server (load average "
            f"{r['machine']['load_average_before'][0]} before, "
            f"{r['machine']['load_average_after'][0]} after); Python {r['machine']['python']}.",
            "",
            "| measure | value | target |",
            "|---|---|---|",
            "| /predict p50, cached graph id, 8 configs (raw keep-alive socket) | "
            f"{lat['raw_socket']['p50_ms']:.2f} ms | <= 5 ms |",
            f"| /predict p99 (raw socket) | {lat['raw_socket']['p99_ms']:.2f} ms | |",
            f"| /predict p50 / p99 with the httpx client | {lat['httpx']['p50_ms']:.2f} / "
            f"{lat['httpx']['p99_ms']:.2f} ms | |",
            f"| requests/s, 2 workers, {thr['connections']} connections | "
            f"{thr['requests_per_s']:.0f} | >= 300 |",
            "| server CPU per /predict (1 worker; 2 workers under load) | "
            f"{lat['server_cpu_ms_per_request']:.2f} / {thr['server_cpu_ms_per_request']:.2f} ms"
            " | |",
            f"| cold upload ({up['gzip_bytes'] / 1024:.0f} KiB gzip), p50 of {up['n']} | "
            f"{up['p50_ms']:.1f} ms (max {up['max_ms']:.1f}) | |",
            "",
            f"Command: `.venv/bin/python benchmarks/serving.py{r.get('args', '')}`",
            "",
        ]
    )


if __name__ == "__main__":
    main()
