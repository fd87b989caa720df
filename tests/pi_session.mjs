// pi's own session code, from the pinned package, for tests/test_interop.py.
//   node pi_session.mjs context FILE            -> {"messages": buildSessionContext(...).messages}
//   node pi_session.mjs branch FILE FROM SUMMARY  -> branch_summary entry from FROM (new leaf)
//   node pi_session.mjs edit FILE TARGET JSON    -> context_edit of TARGET (JSON: null or {content})
//   node pi_session.mjs extras FILE TARGET       -> a custom_message, a label on TARGET, a name, a custom entry
//   node pi_session.mjs quiet FILE               -> a custom_message given no display and no details
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

// The pinned package's dist/ (the test passes the one tether runs), else this checkout's.
const here = dirname(fileURLToPath(import.meta.url));
const dist = process.env.TETHER_PI_DIST ?? join(here, "..", "node_modules", "@earendil-works", "pi-coding-agent", "dist");
const pi = await import(join(dist, "index.js"));
const { SessionManager, buildSessionContext, migrateSessionEntries, parseSessionEntries } = pi;

const [command, file, ...rest] = process.argv.slice(2);
if (command === "context") {
  // What pi loads: malformed lines skipped, migrated to v3; the leaf is the last entry.
  const entries = parseSessionEntries(readFileSync(file, "utf8"));
  migrateSessionEntries(entries);
  const body = entries.filter((e) => e.type !== "session");
  const ctx = buildSessionContext(body);
  process.stdout.write(JSON.stringify({ messages: ctx.messages, thinkingLevel: ctx.thinkingLevel, model: ctx.model }));
} else if (command === "branch") {
  const sm = SessionManager.open(file);
  process.stdout.write(sm.branchWithSummary(rest[0], rest[1]));
} else if (command === "edit") {
  const sm = SessionManager.open(file);
  process.stdout.write(sm.appendContextEdit(rest[0], JSON.parse(rest[1])));
} else if (command === "extras") {
  const sm = SessionManager.open(file);
  sm.appendCustomMessageEntry("ext.note", "EXTENSION-NOTE-3b7: injected context", true, { k: 1 });
  sm.appendLabelChange(rest[0], "start-here");
  sm.appendSessionInfo("interop test");
  sm.appendCustomEntry("ext.state", { count: 42 });
  process.stdout.write(sm.getLeafId());
} else if (command === "quiet") {
  // what an extension's message is when it leaves `display` out: pi writes no such field
  const sm = SessionManager.open(file);
  process.stdout.write(sm.appendCustomMessageEntry("ext.quiet", "QUIET-NOTE: no display given"));
} else {
  process.stderr.write(`unknown command ${command}\n`);
  process.exit(2);
}
