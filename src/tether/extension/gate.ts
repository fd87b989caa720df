/**
 * pi held at its start until its run is ready (docs/architecture.md#custody).
 *
 * A Node preload module (`node --import gate.js <pi>/dist/bundle/cli.js …`), not a pi extension:
 * it runs before pi's entry. The harness starts pi as soon as a request is admitted, while it
 * still records the request and writes the session file pi will open; pi loads its modules
 * meanwhile (most of its start), then waits here until the harness writes one byte to the pipe
 * `TETHER_GATE_FD` names. End of file instead (the harness withdrew the run, or is gone) ends pi
 * with status 75 before it has read or written anything.
 */

import { closeSync, readSync } from "node:fs";
import { enableCompileCache } from "node:module";
import { piCodingAgent } from "./pimodules.js";

export const GATE_FD_ENV = "TETHER_GATE_FD";
/** pi's exit status when its run was withdrawn before pi was let through. */
export const WITHDRAWN_STATUS = 75;

/** True once the harness lets pi through; false at end of file. */
function released(fd: number): boolean {
	const byte = Buffer.alloc(1);
	for (;;) {
		try {
			return readSync(fd, byte, 0, 1, null) === 1;
		} catch (error) {
			const code = (error as NodeJS.ErrnoException).code;
			if (code !== "EAGAIN" && code !== "EINTR") throw error;
		}
	}
}

export const UMASK_ENV = "TETHER_UMASK";

/** pi's keeper starts pi under umask 077, so that the directories Node makes for tether at its
 * start (the compile cache) are private; pi and the agent's tools get the user's umask back. */
function restoreUmask(): void {
	const text = process.env[UMASK_ENV];
	delete process.env[UMASK_ENV];
	if (text !== undefined && /^[0-7]{1,4}$/.test(text)) process.umask(Number.parseInt(text, 8));
}

const fdText = process.env[GATE_FD_ENV];
if (fdText === undefined) restoreUmask();
else {
	// Neither pi nor the tools it runs see the descriptor.
	delete process.env[GATE_FD_ENV];
	// pi's entry turns Node's compile cache on too, but only after this module's imports.
	enableCompileCache();
	restoreUmask();
	try {
		// The bundle's package index loads most of pi's runtime: pi's start, done while waiting.
		await piCodingAgent();
	} catch {
		// Only a head start: pi's entry loads whatever it needs.
	}
	const fd = Number(fdText);
	const go = released(fd);
	closeSync(fd);
	if (!go) process.exit(WITHDRAWN_STATUS);
}
