/**
 * The provider's address inside the sandbox (docs/security.md).
 *
 * A sandboxed pi never holds its provider's credential: tether runs a forwarder outside the
 * sandbox (`sandbox/outside.py`) that adds it, reached through a Unix socket bound into the
 * sandbox (`TETHER_PROVIDER_SOCKET`). The run's `models.json` names the placeholder origin
 * `http://tether-provider.invalid`; this Node preload module (`node --import relay.js …`, before
 * the gate) turns every connection pi's HTTP clients open to that host into a connection to the
 * forwarder's socket, in `net.connect` itself: undici (pi's `fetch`) and `node:http` both open
 * their sockets there. The bytes pi writes go to the forwarder unchanged, one request per
 * connection (the forwarder answers `Connection: close`).
 *
 * An earlier relay listened on the sandbox's loopback and re-sent each request; parsing every
 * request and answer twice in pi's event loop cost a 20-turn run about 6 % of its time. Nothing
 * listens now, so with `network = "host"` no other process on the host can reach this run's
 * provider through pi either.
 */
import net from "node:net";
import { syncBuiltinESMExports } from "node:module";
export const SOCKET_ENV = "TETHER_PROVIDER_SOCKET";
export const PLACEHOLDER_HOST = "tether-provider.invalid";
/** What a TCP connection's options become once they name the forwarder's socket instead. */
function toSocket(options, socketPath) {
    // Drop what only a TCP connection means (address, port, name lookup, family racing).
    const { host: _host, port: _port, lookup: _lookup, family: _family, hints: _hints, localAddress: _localAddress, localPort: _localPort, autoSelectFamily: _autoSelectFamily, autoSelectFamilyAttemptTimeout: _attempt, ...rest } = options;
    return { ...rest, path: socketPath };
}
// A write over the sandbox's file size limit (RLIMIT_FSIZE) sends the writer SIGXFSZ, whose
// default ends it: pi itself (its write and edit tools, its session file) would die with the
// run. Handled, the write fails with EFBIG and the tool reports it. A handler, unlike an
// ignored signal, is not inherited across exec: the tools' own processes keep the default.
process.on("SIGXFSZ", () => { });
const socketPath = process.env[SOCKET_ENV];
if (socketPath !== undefined) {
    // Neither pi's tools nor their children need it.
    delete process.env[SOCKET_ENV];
    const original = net.connect;
    // net.connect(options[, listener]) names the host in an object; the (port, host) and
    // (path) forms are left as they are: pi's clients use the first.
    const connect = function (...args) {
        const [first, listener] = args;
        if (typeof first === "object" && first !== null && first.host === PLACEHOLDER_HOST) {
            const options = toSocket(first, socketPath);
            return typeof listener === "function" ? original(options, listener) : original(options);
        }
        return original.apply(this, args);
    };
    net.connect = connect;
    net.createConnection = connect;
    // `import { connect } from "node:net"` elsewhere sees the same function.
    syncBuiltinESMExports();
}
