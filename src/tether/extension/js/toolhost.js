/**
 * The tool host: pi's built-in tools' file and process operations, served inside the tool
 * sandbox (docs/security.md, "Two boundaries").
 *
 * Not a pi extension: a plain Node program that the provider forwarder (`sandbox/outside.py`,
 * outside both sandboxes) starts in a bubblewrap sandbox of its own, holding the session's
 * workspace read-write, the system read-only and a private `/tmp`, in its own PID namespace.
 * Nothing of pi is there: not its agent dir, session file, `models.json`, sockets or process.
 * pi's extension `toolbox.ts` overrides read, write, edit, bash, grep, find and ls (and `!`
 * commands) with operations that call this host; what a tool does reaches pi only as its result.
 *
 * The listening Unix socket is inherited as descriptor 3: its path lies in a directory bound
 * into pi's sandbox only, so nothing in this sandbox has a name for it. One operation per
 * connection: a JSON line in, then JSON lines out:
 *
 *     → {"op":"read","path":"/w/a.txt"}          ← {"data":"<base64>"}… {"ok":true}
 *     → {"op":"exec","command":"ls","cwd":"/w"}   ← {"data":"<base64>"}… {"ok":true,"exitCode":0}
 *     → {"op":"stat","path":"/w"}                 ← {"ok":true,"value":{…}}
 *     any failure                                  ← {"ok":false,"error":"…","code":"ENOENT"}
 *
 * A client that closes its connection early (an abort, a timeout) ends the operation: a
 * command's whole process group is killed. Commands get this host's environment (set by
 * tether: the agent's `env`, PATH, HOME, LANG, TERM, TMPDIR), never pi's.
 */
import { spawn } from "node:child_process";
import { createReadStream, promises as fs } from "node:fs";
import { createServer } from "node:net";
import path from "node:path";
/** The largest request line: a write carries its content, base64. */
const MAX_REQUEST_BYTES = 128 * 1024 * 1024;
const CHUNK = 64 * 1024;
const SKIP_DIRS = new Set([".git", "node_modules"]);
class Failure extends Error {
    code;
    constructor(message, code = "EINVAL") {
        super(message);
        this.code = code;
    }
}
function text(value, name) {
    if (typeof value !== "string")
        throw new Failure(`${name} must be a string`);
    return value;
}
function send(sock, value) {
    return sock.write(`${JSON.stringify(value)}\n`);
}
/** Wait until the socket drained or closed (backpressure for streamed output). */
function drained(sock) {
    return new Promise((resolve) => {
        const done = () => {
            sock.off("drain", done);
            sock.off("close", done);
            resolve();
        };
        sock.once("drain", done);
        sock.once("close", done);
    });
}
async function streamFile(sock, file) {
    const stream = createReadStream(file, { highWaterMark: CHUNK });
    sock.once("close", () => stream.destroy());
    for await (const chunk of stream) {
        if (sock.destroyed)
            return;
        if (!send(sock, { data: chunk.toString("base64") }))
            await drained(sock);
    }
    send(sock, { ok: true });
}
/** Image types by their first bytes (what pi's local read recognises). */
async function mimeOf(file) {
    const handle = await fs.open(file, "r");
    try {
        const head = Buffer.alloc(12);
        const { bytesRead } = await handle.read(head, 0, 12, 0);
        const b = head.subarray(0, bytesRead);
        if (b.length >= 8 && b.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])))
            return "image/png";
        if (b.length >= 3 && b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff)
            return "image/jpeg";
        if (b.length >= 6 && (b.toString("latin1", 0, 6) === "GIF87a" || b.toString("latin1", 0, 6) === "GIF89a"))
            return "image/gif";
        if (b.length >= 12 && b.toString("latin1", 0, 4) === "RIFF" && b.toString("latin1", 8, 12) === "WEBP")
            return "image/webp";
        return null;
    }
    finally {
        await handle.close();
    }
}
/** Files under `root` (a file: itself), depth first, without .git and node_modules; `visit`
 * returns false to stop. */
async function walk(root, visit) {
    const top = await fs.stat(root);
    if (!top.isDirectory()) {
        await visit(root, path.basename(root));
        return;
    }
    const inner = async (dir, rel) => {
        let entries;
        try {
            entries = await fs.readdir(dir, { withFileTypes: true });
        }
        catch {
            return true;
        }
        entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
        for (const entry of entries) {
            const full = path.join(dir, entry.name);
            const name = rel ? `${rel}/${entry.name}` : entry.name;
            if (entry.isDirectory()) {
                if (SKIP_DIRS.has(entry.name))
                    continue;
                if (!(await inner(full, name)))
                    return false;
            }
            else if (entry.isFile() || entry.isSymbolicLink()) {
                if (!(await visit(full, name)))
                    return false;
            }
        }
        return true;
    };
    await inner(root, "");
}
/** As pi's find and grep: a pattern with '/' matches the path from the root, one without
 * matches the file's name at any depth. */
function globMatch(rel, pattern) {
    const p = pattern.replace(/^(?:\.\/)+/, "");
    return p.includes("/") ? path.matchesGlob(rel, p) : path.matchesGlob(path.basename(rel), p);
}
async function glob(req) {
    const pattern = text(req.pattern, "pattern");
    const root = text(req.cwd, "cwd");
    const limit = typeof req.limit === "number" ? req.limit : 1000;
    const ignore = Array.isArray(req.ignore) ? req.ignore.filter((i) => typeof i === "string") : [];
    const found = [];
    await walk(root, async (_file, rel) => {
        if (ignore.some((i) => path.matchesGlob(rel, i)))
            return true;
        if (globMatch(rel, pattern))
            found.push(rel);
        return found.length < limit;
    });
    return found;
}
/** Matching lines with their context, at most `limit` matches. */
async function grep(req) {
    const root = text(req.path, "path");
    const pattern = text(req.pattern, "pattern");
    const ignoreCase = req.ignoreCase === true;
    const context = typeof req.context === "number" && req.context > 0 ? req.context : 0;
    const limit = typeof req.limit === "number" && req.limit > 0 ? req.limit : 100;
    const only = typeof req.glob === "string" ? req.glob : undefined;
    let test;
    if (req.literal === true) {
        const needle = ignoreCase ? pattern.toLowerCase() : pattern;
        test = (line) => (ignoreCase ? line.toLowerCase() : line).includes(needle);
    }
    else {
        let re;
        try {
            re = new RegExp(pattern, ignoreCase ? "i" : "");
        }
        catch (error) {
            throw new Failure(`invalid regular expression: ${error.message}`);
        }
        test = (line) => re.test(line);
    }
    const isDirectory = (await fs.stat(root)).isDirectory();
    const matches = [];
    let limitReached = false;
    await walk(root, async (file, rel) => {
        if (only !== undefined && !globMatch(rel, only))
            return true;
        let content;
        try {
            content = await fs.readFile(file, "utf8");
        }
        catch {
            return true;
        }
        if (content.includes("\u0000"))
            return true; // binary, as ripgrep skips it
        const lines = content.replace(/\r\n?/g, "\n").split("\n");
        for (let i = 0; i < lines.length; i++) {
            if (!test(lines[i] ?? ""))
                continue;
            const first = Math.max(0, i - context);
            const last = Math.min(lines.length - 1, i + context);
            matches.push({ file: isDirectory ? rel : path.basename(file), line: i, first, lines: lines.slice(first, last + 1) });
            if (matches.length >= limit) {
                limitReached = true;
                return false;
            }
        }
        return true;
    });
    return { matches, isDirectory, limitReached };
}
/** A command in its own process group, its output streamed; killed (the whole group) when
 * the client goes away. */
function exec(sock, req) {
    const command = text(req.command, "command");
    const cwd = text(req.cwd, "cwd");
    return new Promise((resolve) => {
        const child = spawn("/bin/bash", ["-c", command], {
            cwd,
            detached: true,
            stdio: ["ignore", "pipe", "pipe"],
            env: process.env,
        });
        let ended = false;
        const killGroup = () => {
            if (ended || child.pid === undefined)
                return;
            try {
                process.kill(-child.pid, "SIGKILL");
            }
            catch {
                // already gone
            }
        };
        sock.once("close", killGroup);
        const forward = (chunk) => {
            if (!send(sock, { data: chunk.toString("base64") })) {
                child.stdout?.pause();
                child.stderr?.pause();
                void drained(sock).then(() => {
                    child.stdout?.resume();
                    child.stderr?.resume();
                });
            }
        };
        child.stdout?.on("data", forward);
        child.stderr?.on("data", forward);
        child.on("error", (error) => {
            ended = true;
            send(sock, { ok: false, error: error.message, code: "ESPAWN" });
            resolve();
        });
        child.on("close", (code, signal) => {
            // Whatever the shell left behind in its group goes with it, as pi's local bash does.
            killGroup();
            ended = true;
            const exitCode = code ?? (signal ? 128 + (SIGNALS[signal] ?? 0) : null);
            send(sock, { ok: true, exitCode });
            resolve();
        });
    });
}
const SIGNALS = { SIGHUP: 1, SIGINT: 2, SIGQUIT: 3, SIGKILL: 9, SIGSEGV: 11, SIGPIPE: 13, SIGTERM: 15, SIGXCPU: 24, SIGXFSZ: 25, SIGABRT: 6, SIGBUS: 7 };
async function answer(sock, req) {
    const op = req.op;
    const p = () => text(req.path, "path");
    switch (op) {
        case "read":
            return streamFile(sock, p());
        case "exec":
            return exec(sock, req);
        case "access": {
            const mode = req.write === true ? fs.constants.R_OK | fs.constants.W_OK : fs.constants.R_OK;
            await fs.access(p(), mode);
            send(sock, { ok: true });
            return;
        }
        case "exists": {
            const there = await fs.access(p()).then(() => true, () => false);
            send(sock, { ok: true, value: there });
            return;
        }
        case "stat": {
            const st = await fs.stat(p());
            send(sock, { ok: true, value: { isDirectory: st.isDirectory(), size: st.size } });
            return;
        }
        case "readdir":
            send(sock, { ok: true, value: await fs.readdir(p()) });
            return;
        case "mime":
            send(sock, { ok: true, value: await mimeOf(p()) });
            return;
        case "write":
            await fs.writeFile(p(), Buffer.from(text(req.data, "data"), "base64"));
            send(sock, { ok: true });
            return;
        case "mkdir":
            await fs.mkdir(p(), { recursive: true });
            send(sock, { ok: true });
            return;
        case "glob":
            send(sock, { ok: true, value: await glob(req) });
            return;
        case "grep":
            send(sock, { ok: true, value: await grep(req) });
            return;
        default:
            throw new Failure(`unknown operation ${JSON.stringify(op)}`);
    }
}
function serve(sock) {
    let buffered = "";
    let size = 0;
    const onData = (chunk) => {
        size += chunk.length;
        if (size > MAX_REQUEST_BYTES) {
            sock.destroy();
            return;
        }
        buffered += chunk.toString("utf8");
        const end = buffered.indexOf("\n");
        if (end < 0)
            return;
        sock.off("data", onData);
        let req;
        try {
            req = JSON.parse(buffered.slice(0, end));
        }
        catch {
            send(sock, { ok: false, error: "a request that is not JSON", code: "EINVAL" });
            sock.end();
            return;
        }
        answer(sock, req)
            .catch((error) => {
            const err = error;
            send(sock, { ok: false, error: err.message ?? String(error), code: err.code ?? "EIO" });
        })
            .finally(() => sock.end());
    };
    sock.on("data", onData);
    sock.on("error", () => sock.destroy());
}
const server = createServer({ allowHalfOpen: false }, serve);
server.listen({ fd: 3 });
