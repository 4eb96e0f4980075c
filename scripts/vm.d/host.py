#!/usr/bin/python3
"""Host-side helpers of scripts/vm (not part of the image, not hashed into its cache key).

  host.py api-server KCFG            the API server's URL in KCFG's current context
  host.py pkgserver DIR CERT KEY PORTFILE LOG
                                     HTTPS file server on 127.0.0.1 (free port written to PORTFILE)
  host.py stamp                      copy stdin to stdout, each line prefixed with the host's time
  host.py qmp SOCK COMMAND           one QMP command (system_powerdown, quit, ...)
  host.py qga-ping SOCK TIMEOUT      wait until the guest agent answers; exit 1 on timeout
  host.py qga-exec SOCK TIMEOUT STDIN ARG...
                                     run ARG... in the guest (guest-exec), copy its stdout/stderr,
                                     exit with its status (124 on timeout); STDIN is a file whose
                                     bytes go to the command's stdin, or - for none
"""
import base64
import datetime
import functools
import json
import os
import random
import socket
import ssl
import sys
import time


def die(msg, code=1):
    print(f"scripts/vm: error: {msg}", file=sys.stderr)
    sys.exit(code)


# --- kubeconfig -----------------------------------------------------------------------------------
def api_server(src):
    """The server URL of KCFG's current context. Nothing else of it (no credential) reaches the VM."""
    import yaml

    with open(src) as f:
        cfg = yaml.safe_load(f) or {}
    ctx_name = cfg.get("current-context")
    by_name = lambda kind, name: next(
        (x for x in cfg.get(kind) or [] if x.get("name") == name), None)
    ctx = by_name("contexts", ctx_name) if ctx_name else None
    if ctx is None:
        if len(cfg.get("contexts") or []) != 1:
            die(f"{src}: no current-context")
        ctx = cfg["contexts"][0]
    cluster = by_name("clusters", (ctx.get("context") or {}).get("cluster"))
    if cluster is None or "server" not in (cluster.get("cluster") or {}):
        die(f"{src}: the current context names no cluster with a server")
    print(cluster["cluster"]["server"])

# --- package server -------------------------------------------------------------------------------
def pkgserver(directory, cert, key, portfile, log):
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    logf = open(log, "a", buffering=1)

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, fmt, *args):
            logf.write(f"{datetime.datetime.now().isoformat(timespec='milliseconds')} {fmt % args}\n")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=directory))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    with open(portfile + ".tmp", "w") as f:
        f.write(str(httpd.server_address[1]))
    os.rename(portfile + ".tmp", portfile)
    httpd.serve_forever()


# --- console timestamps ---------------------------------------------------------------------------
def stamp():
    inp = sys.stdin.buffer.raw
    out = sys.stdout.buffer
    pending = b""
    while True:
        chunk = inp.read(65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            ts = datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3]
            out.write(ts.encode() + b" " + line.rstrip(b"\r") + b"\n")
        out.flush()
    if pending:
        ts = datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3]
        out.write(ts.encode() + b" " + pending.rstrip(b"\r") + b"\n")
        out.flush()


# --- QMP and the guest agent ----------------------------------------------------------------------
class JsonStream:
    def __init__(self, path, timeout):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = ""
        self.dec = json.JSONDecoder()

    def send(self, obj):
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def recv(self, deadline):
        while True:
            s = self.buf.lstrip("\xff \r\n\t")
            if s:
                try:
                    obj, end = self.dec.raw_decode(s)
                    self.buf = s[end:]
                    return obj
                except json.JSONDecodeError:
                    pass
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("connection closed")
            self.buf += data.decode("latin-1")


def qmp(path, command):
    s = JsonStream(path, 5)
    deadline = time.monotonic() + 10
    s.recv(deadline)  # greeting
    s.send({"execute": "qmp_capabilities"})
    s.recv(deadline)
    s.send({"execute": command})
    while True:
        r = s.recv(deadline)
        if "return" in r or "error" in r:
            break
    if "error" in r:
        die(f"QMP {command}: {r['error'].get('desc')}")


def qga_connect(path, deadline):
    """Connects and synchronises with the guest agent; raises TimeoutError if it does not answer."""
    while True:
        try:
            s = JsonStream(path, 3)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise TimeoutError
            time.sleep(0.5)
    while True:
        sync_id = random.randrange(1, 2**31)
        s.send({"execute": "guest-sync-delimited", "arguments": {"id": sync_id}})
        attempt = min(deadline, time.monotonic() + 3)
        try:
            while True:
                r = s.recv(attempt)
                if r.get("return") == sync_id:
                    return s
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise


def qga_call(s, command, args=None, deadline=None):
    s.send({"execute": command, **({"arguments": args} if args is not None else {})})
    while True:
        r = s.recv(deadline or time.monotonic() + 30)
        if "error" in r:
            raise RuntimeError(f"{command}: {r['error'].get('desc')}")
        if "return" in r and not isinstance(r["return"], int):
            return r["return"]


def qga_ping(path, timeout):
    try:
        s = qga_connect(path, time.monotonic() + float(timeout))
        qga_call(s, "guest-ping")
    except (TimeoutError, ConnectionError):
        sys.exit(1)


def qga_exec(path, timeout, stdin, argv):
    deadline = time.monotonic() + float(timeout)
    try:
        s = qga_connect(path, min(deadline, time.monotonic() + 30))
    except (TimeoutError, ConnectionError):
        die("the guest agent does not answer (is the VM up? see scripts/vm logs NAME)")
    args = {
        "path": argv[0], "arg": argv[1:], "capture-output": True,
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
                "LANG=C.UTF-8", "TERM=dumb", "PAGER=cat", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0"],
    }
    if stdin != "-":
        with open(stdin, "rb") as f:
            args["input-data"] = base64.b64encode(f.read()).decode()
    try:
        pid = qga_call(s, "guest-exec", args)["pid"]
        delay = 0.05
        while True:
            st = qga_call(s, "guest-exec-status", {"pid": pid})
            if st.get("exited"):
                break
            if time.monotonic() > deadline:
                die(f"the command did not finish within {timeout}s (still running in the guest)", 124)
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
    except (TimeoutError, ConnectionError) as e:
        die(f"lost the guest agent while the command ran ({e or type(e).__name__})", 125)
    except RuntimeError as e:
        die(f"guest agent: {e}", 126)
    sys.stdout.buffer.write(base64.b64decode(st.get("out-data", "")))
    sys.stdout.flush()
    sys.stderr.buffer.write(base64.b64decode(st.get("err-data", "")))
    if st.get("out-truncated") or st.get("err-truncated"):
        print("scripts/vm: warning: the guest agent truncated the output", file=sys.stderr)
    if "signal" in st:
        sys.exit(128 + st["signal"])
    sys.exit(st.get("exitcode", 1))


def main(argv):
    if not argv:
        die("host.py: no command")
    cmd, rest = argv[0], argv[1:]
    if cmd == "api-server":
        api_server(*rest)
    elif cmd == "pkgserver":
        pkgserver(*rest)
    elif cmd == "stamp":
        stamp()
    elif cmd == "qmp":
        qmp(*rest)
    elif cmd == "qga-ping":
        qga_ping(*rest)
    elif cmd == "qga-exec":
        qga_exec(rest[0], rest[1], rest[2], rest[3:])
    else:
        die(f"host.py: unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
