/**
 * The provider's address inside the sandbox (DESIGN §3.12).
 *
 * A sandboxed pi never holds its provider's credential: tether runs a forwarder outside the
 * sandbox (`sandbox/outside.py`) that adds it, reached through a Unix socket bound into the
 * sandbox (`TETHER_PROVIDER_SOCKET`). pi's HTTP client needs a TCP URL, so this Node preload
 * module (`node --import relay.js …`, before the gate) listens on the sandbox's own loopback,
 * on a port the kernel picks, and hands every request to the forwarder over a connection of its
 * own, streaming both ways. It then writes its address into the run's `models.json` (which
 * names the placeholder origin `http://tether-provider.invalid`) before pi reads it.
 *
 * With `network = "host"` the loopback is the host's: the address carries a per-run token as
 * its first path segment (`TETHER_RELAY_TOKEN`), and a request without it is refused, so another
 * process on the host cannot use this run's provider.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { createServer, request } from "node:http";
import { join } from "node:path";
export const SOCKET_ENV = "TETHER_PROVIDER_SOCKET";
export const TOKEN_ENV = "TETHER_RELAY_TOKEN";
export const PLACEHOLDER_ORIGIN = "http://tether-provider.invalid";
/** Headers that belong to one connection, not to the request or answer. */
const HOP_BY_HOP = new Set(["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"]);
function endToEnd(headers) {
    const out = {};
    for (const [name, value] of Object.entries(headers)) {
        if (!HOP_BY_HOP.has(name))
            out[name] = value;
    }
    return out;
}
function refuse(res, status, why) {
    if (!res.headersSent)
        res.writeHead(status, { "content-type": "text/plain" });
    res.end(`tether's provider relay: ${why}\n`);
}
function relay(socketPath, prefix, req, res) {
    const url = req.url ?? "/";
    if (!url.startsWith(`${prefix}/`)) {
        refuse(res, 403, "not this run's provider address");
        return;
    }
    const upstream = request({ socketPath, path: url.slice(prefix.length), method: req.method, headers: endToEnd(req.headers), agent: false }, (answer) => {
        res.writeHead(answer.statusCode ?? 502, endToEnd(answer.headers));
        res.flushHeaders();
        answer.pipe(res);
    });
    upstream.on("error", (error) => refuse(res, 502, `cannot reach the forwarder: ${error.message}`));
    res.on("close", () => upstream.destroy());
    req.pipe(upstream);
}
// A write over the sandbox's file size limit (RLIMIT_FSIZE) sends the writer SIGXFSZ, whose
// default ends it: pi itself (its write and edit tools, its session file) would die with the
// run. Handled, the write fails with EFBIG and the tool reports it. A handler, unlike an
// ignored signal, is not inherited across exec: the tools' own processes keep the default.
process.on("SIGXFSZ", () => { });
const socketPath = process.env[SOCKET_ENV];
const token = process.env[TOKEN_ENV];
if (socketPath !== undefined && token !== undefined) {
    // Neither pi's tools nor their children need them: the address is in models.json.
    delete process.env[SOCKET_ENV];
    delete process.env[TOKEN_ENV];
    const prefix = `/${token}`;
    const server = createServer({ noDelay: true }, (req, res) => relay(socketPath, prefix, req, res));
    await new Promise((resolve, reject) => {
        server.once("error", reject);
        server.listen(0, "127.0.0.1", () => resolve());
    });
    // Listening never keeps pi alive: pi ends when its work does.
    server.unref();
    const { port } = server.address();
    const agentDir = process.env.PI_CODING_AGENT_DIR;
    if (agentDir !== undefined) {
        const models = join(agentDir, "models.json");
        const text = readFileSync(models, "utf8");
        writeFileSync(models, text.split(PLACEHOLDER_ORIGIN).join(`http://127.0.0.1:${port}${prefix}`));
    }
}
