/**
 * pi's own modules, for tether's extensions at run time.
 *
 * tether ships its extensions compiled (`js/*.js`, ES modules; `make extension` builds them
 * from these sources). pi's loader imports compiled modules natively, where a `.ts` file costs
 * every pi start a TypeScript transform (about 0.1 s each, 0.3 s for the three, measured by
 * `bench/harness.py`). A native import resolves bare names from the importing file, and tether's
 * files do not sit under pi's `node_modules`, so what an extension needs from pi at run time is
 * imported from the pi that loaded it, as pi's own loader would alias it: the harness always
 * starts pi as `node <pi>/dist/bundle/cli.js`, beside the bundle's package index. Types still
 * come from the pinned pi (`tsc`).
 */

import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { pathToFileURL } from "node:url";
import type * as PiCodingAgent from "@earendil-works/pi-coding-agent";

/** pi's entry script, which tether's harness passes as node's first argument. */
function piCli(): string {
	const cli = process.argv[1];
	if (cli === undefined || !existsSync(cli)) {
		throw new Error(`tether's extensions run inside pi started as \`node <pi>/dist/bundle/cli.js\`; got ${String(cli)}`);
	}
	return cli;
}

/** `@earendil-works/pi-coding-agent`, the package index of the running pi. */
export async function piCodingAgent(): Promise<typeof PiCodingAgent> {
	const index = join(dirname(piCli()), "index.js");
	return (await import(pathToFileURL(index).href)) as typeof PiCodingAgent;
}
