/**
 * Anchors of a continuation checkpoint (DESIGN §3.13): exact identifiers taken mechanically from
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
 * (the first line of a failed tool result, and error lines in tool output). Newest first, one
 * anchor per (kind, text), at most `maxBytes` of compact JSON.
 */

export type AnchorKind = "read" | "write" | "command" | "sha" | "url" | "error";

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
const SHA = /\b[0-9a-f]{40}\b/g;
const URL_PATTERN = /\bhttps?:\/\/[^\s"'<>`)\]}]+/g;
const ERROR_LINE =
	/^\s*(?:[A-Za-z_][\w.]*(?:Error|Exception)\b|error\b|ERROR\b|fatal\b|FATAL\b|panic\b|Traceback\b|FAILED\b)/;
const KINDS: ReadonlySet<string> = new Set(["read", "write", "command", "sha", "url", "error"]);

type Rec = Record<string, unknown>;

function isRecord(value: unknown): value is Rec {
	return typeof value === "object" && value !== null && !Array.isArray(value);
}

function clip(text: string): string {
	const line = text.trim();
	return line.length <= TEXT_MAX ? line : `${line.slice(0, TEXT_MAX - 1)}…`;
}

function textOf(content: unknown): string {
	if (typeof content === "string") return content;
	if (!Array.isArray(content)) return "";
	return content
		.filter((b): b is Rec => isRecord(b) && b.type === "text" && typeof b.text === "string")
		.map((b) => b.text as string)
		.join("\n");
}

/** Identifiers in a piece of tool output or command text: SHAs, URLs, error lines. */
function scan(text: string, entry: string, out: Anchor[], errors: boolean): void {
	for (const m of text.matchAll(SHA)) out.push({ kind: "sha", text: m[0], entry });
	for (const m of text.matchAll(URL_PATTERN)) out.push({ kind: "url", text: clip(m[0]), entry });
	if (!errors) return;
	for (const line of text.split("\n")) {
		if (ERROR_LINE.test(line)) out.push({ kind: "error", text: clip(line), entry });
	}
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
		if (message.isError === true) {
			const first = text.split("\n").find((l) => l.trim());
			if (first) out.push({ kind: "error", text: clip(first), entry: id });
		}
		scan(text, id, out, true);
	} else if (role === "bashExecution" && typeof message.command === "string") {
		const exit = typeof message.exitCode === "number" ? message.exitCode : null;
		out.push({ kind: "command", text: clip(message.command), exit, entry: id });
		scan(typeof message.output === "string" ? message.output : "", id, out, true);
	} else if (role === "user") {
		scan(textOf(message.content), id, out, false);
	}
	return out;
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
	for (let i = entries.length - 1; i >= 0; i--) {
		const e = entries[i] as Rec;
		const m = e.message as Rec;
		old.push(...carried(m));
		fresh.push(...fromEntry(String(e.id), m, results));
	}
	const items: Anchor[] = [];
	const seen = new Set<string>();
	let bytes = 2;
	let omitted = 0;
	for (const item of [...fresh, ...old]) {
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
