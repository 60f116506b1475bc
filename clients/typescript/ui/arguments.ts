// Edited tool arguments, checked on the page before they are sent: JSON, an object, and the parts of the
// tool's JSON schema a person gets wrong by hand (required keys, types, enums, unknown keys). The server
// checks the full schema again (422), so this only spares a round trip and says what is wrong at once.

export type Checked = { ok: true; value: Record<string, unknown> } | { ok: false; error: string };

type Schema = {
  type?: string | string[];
  properties?: Record<string, Schema>;
  required?: string[];
  additionalProperties?: boolean;
  enum?: unknown[];
};

function typeOf(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "number") return Number.isInteger(value) ? "integer" : "number";
  return typeof value;
}

function fits(value: unknown, type: string): boolean {
  const actual = typeOf(value);
  return actual === type || (type === "number" && actual === "integer");
}

export function checkArguments(text: string, schema?: unknown): Checked {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    return { ok: false, error: `Not valid JSON: ${error instanceof Error ? error.message : String(error)}` };
  }
  if (typeOf(value) !== "object") return { ok: false, error: `The arguments must be a JSON object, not ${typeOf(value)}.` };
  const object = value as Record<string, unknown>;
  const s = (schema ?? {}) as Schema;
  const missing = (s.required ?? []).filter((key) => !(key in object));
  if (missing.length) return { ok: false, error: `Missing: ${missing.join(", ")}.` };
  for (const [key, item] of Object.entries(object)) {
    const property = s.properties?.[key];
    if (!property) {
      if (s.additionalProperties === false) return { ok: false, error: `Unknown argument: ${key}.` };
      continue;
    }
    const types = property.type === undefined ? [] : Array.isArray(property.type) ? property.type : [property.type];
    if (types.length && !types.some((t) => fits(item, t))) {
      return { ok: false, error: `${key} must be ${types.join(" or ")}, not ${typeOf(item)}.` };
    }
    if (property.enum && !property.enum.some((e) => JSON.stringify(e) === JSON.stringify(item))) {
      return { ok: false, error: `${key} must be one of ${property.enum.map((e) => JSON.stringify(e)).join(", ")}.` };
    }
  }
  return { ok: true, value: object };
}
