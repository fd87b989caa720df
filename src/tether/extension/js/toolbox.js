/**
 * pi's built-in tools, run in the tool sandbox (docs/security.md, "Two boundaries").
 *
 * Loaded with `pi -e` only in a sandboxed run. read, write, edit, bash, grep, find and ls are
 * registered again under their own names, built by pi's own factories with pluggable
 * operations (pi's extensions.md, "Remote Execution") that call the tool host
 * (`toolhost.ts`) over the Unix socket named by `TETHER_TOOLBOX_SOCKET`. grep, whose
 * operations cover only the directory check, has its search done by the host. `!` commands go
 * there too (`user_bash`). pi's own process never opens a workspace file or starts a command:
 * the workspace is not even mounted in pi's sandbox, only an empty directory at its path, so
 * paths mean the same on both sides.
 */
import { createConnection } from "node:net";
import { resolve } from "node:path";
import { piCodingAgent } from "./pimodules.js";
export const TOOLBOX_SOCKET_ENV = "TETHER_TOOLBOX_SOCKET";
class HostError extends Error {
    code;
    constructor(message, code) {
        super(message);
        this.code = code;
    }
}
/** One operation: send the request, hand each `data` line to `onData`, resolve with the
 * final line. An abort closes the connection, which ends the operation on the host. */
function call(socket, request, options = {}) {
    return new Promise((resolve, reject) => {
        const conn = createConnection(socket);
        let buffered = "";
        let settled = false;
        const finish = (error, line) => {
            if (settled)
                return;
            settled = true;
            options.signal?.removeEventListener("abort", onAbort);
            conn.destroy();
            if (error)
                reject(error);
            else
                resolve(line ?? {});
        };
        const onAbort = () => finish(new Error("aborted"));
        if (options.signal?.aborted) {
            onAbort();
            return;
        }
        options.signal?.addEventListener("abort", onAbort, { once: true });
        conn.on("connect", () => conn.write(`${JSON.stringify(request)}\n`));
        conn.on("data", (chunk) => {
            buffered += chunk.toString("utf8");
            let end = buffered.indexOf("\n");
            while (end >= 0 && !settled) {
                const text = buffered.slice(0, end);
                buffered = buffered.slice(end + 1);
                let line;
                try {
                    line = JSON.parse(text);
                }
                catch {
                    finish(new Error("the tool sandbox sent a line that is not JSON"));
                    return;
                }
                if (typeof line.data === "string")
                    options.onData?.(Buffer.from(line.data, "base64"));
                else if (line.ok === true)
                    finish(undefined, line);
                else
                    finish(new HostError(String(line.error ?? "the tool sandbox failed"), String(line.code ?? "EIO")));
                end = buffered.indexOf("\n");
            }
        });
        conn.on("error", (err) => finish(new Error(`cannot reach the tool sandbox: ${err.message}`)));
        conn.on("close", () => finish(new Error("the tool sandbox closed the connection without an answer")));
    });
}
async function value(socket, request) {
    return (await call(socket, request)).value;
}
async function readAll(socket, path) {
    const chunks = [];
    await call(socket, { op: "read", path }, { onData: (data) => chunks.push(data) });
    return Buffer.concat(chunks);
}
/** A stream of the file's chunks as the host sends them (pi's read keeps only what it shows). */
async function* readStream(socket, path, signal) {
    const queue = [];
    let wake;
    let ended = false;
    let failure;
    const done = call(socket, { op: "read", path }, {
        signal,
        onData: (data) => {
            queue.push(data);
            wake?.();
        },
    }).then(() => {
        ended = true;
        wake?.();
    }, (error) => {
        failure = error;
        ended = true;
        wake?.();
    });
    while (true) {
        const next = queue.shift();
        if (next !== undefined) {
            yield next;
            continue;
        }
        if (ended)
            break;
        await new Promise((resolve) => {
            wake = resolve;
        });
        wake = undefined;
    }
    await done;
    if (failure !== undefined)
        throw failure;
}
function bashOperations(socket) {
    return {
        // pi's environment (`options.env`) stays with pi: commands get the host's own.
        async exec(command, cwd, { onData, signal, timeout }) {
            const controller = new AbortController();
            const onAbort = () => controller.abort();
            signal?.addEventListener("abort", onAbort, { once: true });
            let timedOut = false;
            const timer = timeout !== undefined && timeout > 0
                ? setTimeout(() => {
                    timedOut = true;
                    controller.abort();
                }, timeout * 1000)
                : undefined;
            try {
                const end = await call(socket, { op: "exec", command, cwd }, { onData, signal: controller.signal });
                return { exitCode: typeof end.exitCode === "number" ? end.exitCode : null };
            }
            catch (error) {
                if (signal?.aborted)
                    throw new Error("aborted");
                if (timedOut)
                    throw new Error(`timeout:${timeout}`);
                throw error;
            }
            finally {
                if (timer)
                    clearTimeout(timer);
                signal?.removeEventListener("abort", onAbort);
            }
        },
    };
}
export default async function toolbox(pi) {
    const socket = process.env[TOOLBOX_SOCKET_ENV];
    delete process.env[TOOLBOX_SOCKET_ENV];
    if (!socket)
        return; // not a sandboxed run: pi's own tools run where pi does
    const agent = await piCodingAgent();
    const cwd = process.cwd();
    const readOps = {
        readFile: (path) => readAll(socket, path),
        access: async (path) => {
            await call(socket, { op: "access", path });
        },
        detectImageMimeType: (path) => value(socket, { op: "mime", path }),
        createReadStream: (path, { signal }) => readStream(socket, path, signal),
    };
    const writeOps = {
        writeFile: async (path, content) => {
            await call(socket, { op: "write", path, data: Buffer.from(content, "utf8").toString("base64") });
        },
        mkdir: async (path) => {
            await call(socket, { op: "mkdir", path });
        },
    };
    const editOps = {
        readFile: readOps.readFile,
        writeFile: writeOps.writeFile,
        access: async (path) => {
            await call(socket, { op: "access", path, write: true });
        },
    };
    const exists = (path) => value(socket, { op: "exists", path });
    const lsOps = {
        exists,
        stat: async (path) => {
            const st = await value(socket, { op: "stat", path });
            return { isDirectory: () => st.isDirectory };
        },
        readdir: (path) => value(socket, { op: "readdir", path }),
    };
    const findOps = {
        exists,
        glob: (pattern, root, { ignore, limit }) => value(socket, { op: "glob", pattern, cwd: root, ignore, limit }),
    };
    const bashOps = bashOperations(socket);
    pi.registerTool(agent.createReadToolDefinition(cwd, { operations: readOps }));
    pi.registerTool(agent.createWriteToolDefinition(cwd, { operations: writeOps }));
    pi.registerTool(agent.createEditToolDefinition(cwd, { operations: editOps }));
    pi.registerTool(agent.createBashToolDefinition(cwd, { operations: bashOps }));
    pi.registerTool(agent.createLsToolDefinition(cwd, { operations: lsOps }));
    pi.registerTool(agent.createFindToolDefinition(cwd, { operations: findOps }));
    const grep = agent.createGrepToolDefinition(cwd);
    pi.registerTool({
        ...grep,
        async execute(_id, params, signal) {
            const limit = Math.max(1, Math.floor(params.limit ?? 100));
            const root = resolve(cwd, (params.path ?? ".").replace(/^@/, ""));
            const found = (await call(socket, {
                op: "grep",
                path: root,
                pattern: params.pattern,
                glob: params.glob,
                ignoreCase: params.ignoreCase,
                literal: params.literal,
                context: params.context,
                limit,
            }, { signal })).value;
            if (found.matches.length === 0)
                return { content: [{ type: "text", text: "No matches found" }], details: undefined };
            const out = [];
            let linesTruncated = false;
            for (const match of found.matches) {
                match.lines.forEach((raw, i) => {
                    const number = match.first + i + 1;
                    const { text, wasTruncated } = agent.truncateLine(raw);
                    if (wasTruncated)
                        linesTruncated = true;
                    const isMatch = match.first + i === match.line;
                    out.push(isMatch ? `${match.file}:${number}: ${text}` : `${match.file}-${number}- ${text}`);
                });
            }
            const truncation = agent.truncateHead(out.join("\n"), { maxLines: Number.MAX_SAFE_INTEGER });
            let output = truncation.content;
            const details = {};
            const notices = [];
            if (found.limitReached) {
                notices.push(`${limit} matches limit reached. Use limit=${limit * 2} for more, or refine pattern`);
                details.matchLimitReached = limit;
            }
            if (truncation.truncated) {
                notices.push(`${agent.formatSize(agent.DEFAULT_MAX_BYTES)} limit reached`);
                details.truncation = truncation;
            }
            if (linesTruncated) {
                notices.push("Some lines truncated. Use read tool to see full lines");
                details.linesTruncated = true;
            }
            if (notices.length > 0)
                output += `\n\n[${notices.join(". ")}]`;
            return {
                content: [{ type: "text", text: output }],
                details: Object.keys(details).length > 0 ? details : undefined,
            };
        },
    });
    pi.on("user_bash", () => ({ operations: bashOps }));
}
