/**
 * Anchors of a continuation checkpoint (docs/cli.md#tether-eval-continuation): exact identifiers taken mechanically from
 * the rows of the working view the checkpoint covers, never from model text.
 *
 * Each anchor names the session entry it came from (`entry`, pi's entry id); tether's mirror
 * turns that id into the ledger seq of the entry's row when it writes the compaction row (it
 * knows every entry's seq: the ones tether pre-wrote from the view and the ones pi appended).
 * Anchors of an earlier checkpoint that the view quoted (the `tether.anchors` message, one JSON
 * object per quoted line) already carry their seq and are kept, after the new ones.
 *
 * Kinds: `read` and `write` (paths from the read, write and edit tool calls, as pi's own
 * compactions keep readFiles/modifiedFiles), `command` (a bash tool call or a user's `!` command,
 * with its exit status: the anchor's row is the result's), `sha` (40 hex digits), `url`, `error`
 * (diagnostic lines of tool output: compiler, test runner, npm, cargo, exceptions; the
 * first line of a failed result only when none is found and it is no command line), `said` (the
 * text of each user message, steers included, clipped), `measure` (tool-output lines holding a
 * number with a unit, or a `key=value` / `key: value` metric). One anchor per (kind, text), at
 * most `maxBytes` of compact JSON: newest first, then the carried ones, and last the model's own
 * failed guesses (a failed read of a path no tool output named, a command that does not exist,
 * and their errors), so they never crowd out what the tools found.
 */

export type AnchorKind = "read" | "write" | "command" | "sha" | "url" | "error" | "said" | "measure";

export interface Anchor {
	kind: AnchorKind;
	text: string;
	exit?: number | null;
	/** pi's entry id of the source row (new anchors). */
	entry?: string;
	/** The ledger seq of the source row (anchors carried from a quoted earlier checkpoint). */
	seq?: number;
}

export interface Anchors {
	version: 1;
	items: Anchor[];
	/** Anchors left out by the byte bound. */
	omitted: number;
}

/** The view message tether quotes a checkpoint's anchors in (followup/messages.py). */
export const ANCHORS_TYPE = "tether.anchors";
const TEXT_MAX = 300;
/** What people said is kept longer: a decision often comes at the end of a request. */
const SAID_MAX = 1000;
/** At most this many measured values per row (a table of numbers is one row's worth). */
const MEASURES_PER_ROW = 12;
const SHA = /\b[0-9a-f]{40}\b/g;
const URL_PATTERN = /\bhttps?:\/\/[^\s"'<>`)\]}]+/g;
/** Diagnostic lines of real tools' output. Each alternative needs the shape a tool prints (a
 * colon after the word, a location, a test id), so a command line is never one. */
const ERROR_LINES: readonly RegExp[] = [
	// Exceptions (Python's last traceback line, Java, JS): `ValueError: …`, `pkg.Error: …`
	/^\s*(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)(?::|$)/,
	// compiler diagnostics at a location: `src/a.c:3:5: error: …`, `a.ts(3,5): error TS2322: …`
	/^\S+?(?::\d+){1,2}:\s*(?:fatal\s+)?error\b/,
	/^\S+\(\d+,\d+\):\s*error\b/,
	// rustc, cargo, and tools that print `error: …` / `ERROR …` / `fatal: …` / `panic: …`
	/^\s*(?:error|Error|ERROR)(?:\[[\w-]+\])?:/,
	/^\s*ERROR\s+\S/,
	/^\s*(?:fatal|FATAL|panic)(?::|\s+error\b)/,
	/^thread '[^']*' panicked at/,
	// npm, make
	/^npm (?:ERR!|error)\s+\S/,
	/^(?:g?make)(?:\[\d+\])?: \*\*\*/,
	// pytest: `FAILED tests/x.py::t - …`, `E   AssertionError: …`
	/^FAILED\s+\S+::/,
	/^E\s{2,}\S/,
	// the shell and the system
	/: (?:command )?not found\s*$/,
	/\b(?:ENOENT|EACCES|EISDIR|ENOTDIR)\b|No such file or directory|Permission denied/,
];
/** A line that is a command being run (a build log's echo), never an error. */
const COMMAND_LINE =
	/^\s*(?:\[\s*\d+\s*\]\s*|\$\s+|\+\s+|>\s+)?(?:cc|gcc|g\+\+|clang(?:\+\+)?|ld|rustc|cargo|npm(?!\s+(?:ERR!|error\b|warn\b|WARN\b))|npx|node|python3?|pytest|make|sh|bash|go|tsc|javac|java|git)\s/;
const STATUS_LINE = /^Command exited with code \d+\s*$/;
const UNIT =
	"(?:ns|µs|us|ms|s|sec|min|h|B|KB|MB|GB|TB|KiB|MiB|GiB|TiB|kB|%|req/s|rps|ops/s|qps|Hz|kHz|MHz|GHz|tokens|rows|files|tests)";
const MEASURE_LINES: readonly RegExp[] = [
	new RegExp(`(?<![\\w.])-?\\d+(?:[.,]\\d+)?\\s?${UNIT}(?![\\w])`),
	/(?:^|[\s,;(])[A-Za-z_][\w.\-/]*(?:=|:\s?)-?\d+(?:\.\d+)?(?![\w.:\-])/,
];
const KINDS: ReadonlySet<string> = new Set([
	"read",
	"write",
	"command",
	"sha",
	"url",
	"error",
	"said",
	"measure",
]);

type Rec = Record<string, unknown>;

function isRecord(value: unknown): value is Rec {
	return typeof value === "object" && value !== null && !Array.isArray(value);
}

function clip(text: string, max = TEXT_MAX): string {
	const line = text.trim();
	return line.length <= max ? line : `${line.slice(0, max - 1)}…`;
}

/** Whether `line` is a diagnostic line of a tool's output. */
export function isErrorLine(line: string): boolean {
	if (!line.trim() || COMMAND_LINE.test(line)) return false;
	return ERROR_LINES.some((re) => re.test(line));
}

/** Whether `line` holds a measured value: a number with a unit, or a numeric metric. */
export function isMeasureLine(line: string): boolean {
	if (!line.trim() || COMMAND_LINE.test(line)) return false;
	return MEASURE_LINES.some((re) => re.test(line));
}

function textOf(content: unknown): string {
	if (typeof content === "string") return content;
	if (!Array.isArray(content)) return "";
	return content
		.filter((b): b is Rec => isRecord(b) && b.type === "text" && typeof b.text === "string")
		.map((b) => b.text as string)
		.join("\n");
}

/** Identifiers in a piece of tool output or command text: SHAs, URLs, and for tool output
 * error lines and measured values. */
function scan(text: string, entry: string, out: Anchor[], output: boolean): void {
	for (const m of text.matchAll(SHA)) out.push({ kind: "sha", text: m[0], entry });
	for (const m of text.matchAll(URL_PATTERN)) out.push({ kind: "url", text: clip(m[0]), entry });
	if (!output) return;
	let measures = 0;
	for (const line of text.split("\n")) {
		if (isErrorLine(line)) out.push({ kind: "error", text: clip(line), entry });
		else if (measures < MEASURES_PER_ROW && isMeasureLine(line)) {
			measures++;
			out.push({ kind: "measure", text: clip(line), entry });
		}
	}
}

/** The error line of a failed result that shows none of the known shapes: its last line that
 * is neither a command line nor the exit status (a shell's complaint comes last). */
function fallbackError(text: string): string | undefined {
	const lines = text.split("\n").filter((l) => l.trim() && !STATUS_LINE.test(l.trim()));
	const last = lines[lines.length - 1];
	return last !== undefined && !COMMAND_LINE.test(last) ? last : undefined;
}

function exitOf(result: Rec): number | null {
	const structured = result.structuredContent;
	if (isRecord(structured) && typeof structured.exit_code === "number") return structured.exit_code;
	const status = /Command exited with code (\d+)\s*$/.exec(textOf(result.content));
	if (status) return Number(status[1]);
	return result.isError === true ? null : 0;
}

/** The anchors of one message entry, in the order they occur in it. `results` maps a tool call id
 * to its result entry (id and message), so a command's anchor names the row holding its status. */
function fromEntry(id: string, message: Rec, results: Map<string, { id: string; message: Rec }>): Anchor[] {
	const out: Anchor[] = [];
	const role = message.role;
	if (role === "assistant" && Array.isArray(message.content)) {
		for (const block of message.content) {
			if (!isRecord(block) || block.type !== "toolCall" || !isRecord(block.arguments)) continue;
			const args = block.arguments;
			const name = String(block.name ?? "");
			const result = typeof block.id === "string" ? results.get(block.id) : undefined;
			if ((name === "read" || name === "write" || name === "edit") && typeof args.path === "string") {
				out.push({ kind: name === "read" ? "read" : "write", text: clip(args.path), entry: id });
			} else if (name === "bash" && typeof args.command === "string") {
				const exit = result ? exitOf(result.message) : null;
				out.push({ kind: "command", text: clip(args.command), exit, entry: result?.id ?? id });
			}
		}
	} else if (role === "toolResult") {
		const text = textOf(message.content);
		if (message.isError === true && !text.split("\n").some(isErrorLine)) {
			const line = fallbackError(text);
			if (line) out.push({ kind: "error", text: clip(line), entry: id });
		}
		scan(text, id, out, true);
	} else if (role === "bashExecution" && typeof message.command === "string") {
		const exit = typeof message.exitCode === "number" ? message.exitCode : null;
		out.push({ kind: "command", text: clip(message.command), exit, entry: id });
		scan(typeof message.output === "string" ? message.output : "", id, out, true);
	} else if (role === "user") {
		const text = textOf(message.content);
		if (text.trim()) out.push({ kind: "said", text: clip(text.replace(/\s+/g, " "), SAID_MAX), entry: id });
		scan(text, id, out, false);
	}
	return out;
}

function readGuessed(message: Rec, path: string, calls: ReadonlySet<string>): boolean {
	if (!Array.isArray(message.content)) return false;
	return message.content.some(
		(b) =>
			isRecord(b) &&
			b.type === "toolCall" &&
			b.name === "read" &&
			typeof b.id === "string" &&
			calls.has(b.id) &&
			isRecord(b.arguments) &&
			clip(String(b.arguments.path ?? "")) === path,
	);
}

/** Anchors an earlier checkpoint's quoted `tether.anchors` message carries (with their seqs). */
export function carried(message: Rec): Anchor[] {
	if (message.role !== "custom" || message.customType !== ANCHORS_TYPE) return [];
	const out: Anchor[] = [];
	for (const line of textOf(message.content).split("\n")) {
		if (!line.startsWith("> {")) continue;
		let item: unknown;
		try {
			item = JSON.parse(line.slice(2));
		} catch {
			continue;
		}
		if (!isRecord(item) || typeof item.text !== "string" || !KINDS.has(String(item.kind))) continue;
		if (typeof item.seq !== "number" || !Number.isSafeInteger(item.seq)) continue;
		const anchor: Anchor = { kind: item.kind as AnchorKind, text: item.text, seq: item.seq };
		if (typeof item.exit === "number" || item.exit === null) anchor.exit = item.exit;
		out.push(anchor);
	}
	return out;
}

/** The entries of the branch that pi's working view is built from: those after the newest
 * compaction, and the ones that compaction kept before it. */
function workingEntries(branch: readonly unknown[]): Rec[] {
	const entries = branch.filter(isRecord);
	let start = 0;
	for (let i = entries.length - 1; i >= 0; i--) {
		const e = entries[i] as Rec;
		if (e.type !== "compaction") continue;
		const kept = entries.findIndex((k) => k.id === e.firstKeptEntryId);
		start = kept >= 0 && kept < i ? kept : i + 1;
		break;
	}
	return entries.slice(start).filter((e) => e.type === "message" && isRecord(e.message));
}

/** Entries that hold the model's own failed guesses: the result of a read of a path that no
 * tool output (nor a user) named before it failed, and of a command that does not exist (exit
 * 127, or the shell's "not found"). */
function guesses(entries: readonly Rec[]): Set<string> {
	const out = new Set<string>();
	const calls = new Map<string, { name: string; path?: string }>();
	let seen = "";
	for (const e of entries) {
		const m = e.message as Rec;
		if (m.role === "assistant" && Array.isArray(m.content)) {
			for (const b of m.content) {
				if (!isRecord(b) || b.type !== "toolCall" || typeof b.id !== "string") continue;
				const args = isRecord(b.arguments) ? b.arguments : {};
				calls.set(b.id, {
					name: String(b.name ?? ""),
					path: typeof args.path === "string" ? args.path : undefined,
				});
			}
		} else if (m.role === "toolResult") {
			const text = textOf(m.content);
			const call = typeof m.toolCallId === "string" ? calls.get(m.toolCallId) : undefined;
			if (m.isError === true && call !== undefined) {
				const path = call.path?.replace(/^\.\//, "");
				const unlisted = path !== undefined && !seen.includes(path.split("/").pop() ?? path);
				const missing =
					/: (?:command )?not found\s*$/m.test(text) || /Command exited with code 127\s*$/.test(text);
				if ((call.name === "read" && unlisted) || (call.name === "bash" && missing)) {
					out.add(String(e.id));
				}
			}
			seen += `\n${text}`;
		} else if (m.role === "user" || m.role === "bashExecution") {
			seen += `\n${textOf(m.content)}${typeof m.output === "string" ? m.output : ""}`;
		}
	}
	return out;
}

function size(item: Anchor): number {
	return Buffer.byteLength(JSON.stringify(item), "utf8") + 1;
}

/** The anchors of the working view in `branch` (pi's branch entries), at most `maxBytes`. */
export function extractAnchors(branch: readonly unknown[], maxBytes: number): Anchors {
	const entries = workingEntries(branch);
	const results = new Map<string, { id: string; message: Rec }>();
	for (const e of entries) {
		const m = e.message as Rec;
		if (m.role === "toolResult" && typeof m.toolCallId === "string") {
			results.set(m.toolCallId, { id: String(e.id), message: m });
		}
	}
	const fresh: Anchor[] = [];
	const old: Anchor[] = [];
	const guessed: Anchor[] = [];
	const failed = guesses(entries);
	// A guessed read's path anchor sits on the call's entry: it goes with the failed result.
	const guessedCalls = new Set<string>();
	for (const e of entries) {
		const m = e.message as Rec;
		if (m.role === "toolResult" && failed.has(String(e.id)) && typeof m.toolCallId === "string") {
			guessedCalls.add(m.toolCallId);
		}
	}
	for (let i = entries.length - 1; i >= 0; i--) {
		const e = entries[i] as Rec;
		const m = e.message as Rec;
		old.push(...carried(m));
		for (const a of fromEntry(String(e.id), m, results)) {
			const guess =
				failed.has(a.entry ?? "") ||
				(a.kind === "read" && m.role === "assistant" && readGuessed(m, a.text, guessedCalls));
			(guess ? guessed : fresh).push(a);
		}
	}
	const items: Anchor[] = [];
	const seen = new Set<string>();
	let bytes = 2;
	let omitted = 0;
	for (const item of [...fresh, ...old, ...guessed]) {
		const key = `${item.kind}\u0000${item.text}`;
		if (seen.has(key)) continue;
		seen.add(key);
		const cost = size(item);
		if (bytes + cost > maxBytes) {
			omitted++;
			continue;
		}
		bytes += cost;
		items.push(item);
	}
	return { version: 1, items, omitted };
}
