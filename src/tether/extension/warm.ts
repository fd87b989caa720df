/**
 * Compile modules into Node's compile cache without running them (`tether.pi.install`).
 *
 *     NODE_COMPILE_CACHE=DIR node warm.js [--require NAME --from FILE] MODULE...
 *
 * A sandboxed pi reads tether's compile cache but may not write it, so on a host whose runs are
 * all sandboxed every module missing from the cache is compiled again at every run. tether fills
 * the cache outside the sandbox, with no agent and no prompt: pi's entry run with `--version`,
 * then this script for what a run loads after the entry (pi's package index, the loader of
 * extensions, a provider's client, tether's own modules).
 *
 * Each MODULE (an ES module's path) is imported behind a module that throws first: Node links,
 * and so compiles, a whole module graph before it evaluates any of it, and the throw ends the
 * evaluation before it reaches them. Nothing of theirs runs. `--require NAME --from FILE`
 * loads a CommonJS package as FILE would resolve it (pi's extension loader, jiti): CommonJS is
 * compiled only when it is loaded, and loading it defines its functions, nothing more.
 */

import { createRequire, flushCompileCache } from "node:module";
import { pathToFileURL } from "node:url";

const STOP = "tether.warm: compiled, not run";

async function compileOnly(modules: string[]): Promise<void> {
	const stop = `data:text/javascript,${encodeURIComponent(`throw ${JSON.stringify(STOP)}`)}`;
	const imports = [stop, ...modules.map((m) => pathToFileURL(m).href)];
	const graph = imports.map((url) => `import ${JSON.stringify(url)};`).join("\n");
	try {
		await import(`data:text/javascript,${encodeURIComponent(graph)}`);
	} catch (error) {
		if (error !== STOP) throw error;
		return;
	}
	throw new Error("tether.warm: the modules were evaluated");
}

async function main(args: string[]): Promise<void> {
	let required: [string, string] | undefined;
	if (args[0] === "--require") {
		const [, name, from, file] = args;
		if (from !== "--from" || name === undefined || file === undefined) {
			throw new Error("usage: warm.js [--require NAME --from FILE] MODULE...");
		}
		required = [name, file];
		args = args.slice(4);
	}
	await compileOnly(args);
	if (required !== undefined) {
		createRequire(pathToFileURL(required[1]).href)(required[0]);
	}
	flushCompileCache();
}

await main(process.argv.slice(2));
