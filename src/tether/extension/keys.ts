/**
 * Provider keys over a private channel (docs/security.md).
 *
 * tether never puts a provider key in pi's environment, argv or a file: pi's tools inherit pi's
 * environment, and files outlive the run. Instead the harness writes the keys into a pipe whose
 * read end pi inherits; `TETHER_KEY_FD` names its descriptor. This extension reads the pipe once
 * at load, closes it, forgets the variable, and registers each key with pi's provider registry,
 * where only pi's provider calls use it.
 */

import { closeSync, readFileSync } from "node:fs";
import type { ExtensionAPI } from "@earendil-works/pi-coding-agent";

/** The variable naming the inherited descriptor. */
export const KEY_FD_ENV = "TETHER_KEY_FD";

/** One provider's key, as the harness writes it. */
export interface KeyGrant {
  provider: string;
  key: string;
}

function isKeyGrant(value: unknown): value is KeyGrant {
  if (typeof value !== "object" || value === null) return false;
  const grant = value as Record<string, unknown>;
  return typeof grant.provider === "string" && typeof grant.key === "string";
}

/** pi reads `$NAME` in an apiKey as a variable and a leading `!` as a command: a literal key
 * escapes both (`$$`, `$!`). */
export function literalKey(key: string): string {
  const escaped = key.split("$").join("$$");
  return escaped.startsWith("!") ? `$${escaped}` : escaped;
}

export function readGrants(fd: number): KeyGrant[] {
  try {
    const parsed: unknown = JSON.parse(readFileSync(fd, "utf8"));
    return Array.isArray(parsed) ? parsed.filter(isKeyGrant) : [];
  } finally {
    closeSync(fd);
  }
}

export default function tetherKeys(pi: ExtensionAPI): void {
  const fd = process.env[KEY_FD_ENV];
  if (fd === undefined) return;
  delete process.env[KEY_FD_ENV];
  for (const grant of readGrants(Number(fd))) {
    pi.registerProvider(grant.provider, { apiKey: literalKey(grant.key) });
  }
}
