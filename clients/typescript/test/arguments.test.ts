// The page's check of edited approval arguments (ui/arguments.ts): what it refuses never reaches the server.
import { describe, expect, it } from "vitest";
import { checkArguments } from "../ui/arguments";

const CALCULATE = {
  type: "object",
  properties: { expression: { type: "string" }, precision: { type: "integer" }, mode: { enum: ["exact", "float"] } },
  required: ["expression"],
  additionalProperties: false,
};

describe("checkArguments", () => {
  it.each([
    ['{"expression": "6*7"', /^Not valid JSON/],
    ["[1, 2]", /must be a JSON object, not array/],
    ["{}", /Missing: expression/],
    ['{"expression": 42}', /expression must be string, not integer/],
    ['{"expression": "1", "precision": 1.5}', /precision must be integer, not number/],
    ['{"expression": "1", "mode": "fast"}', /mode must be one of "exact", "float"/],
    ['{"expression": "1", "x": 1}', /Unknown argument: x/],
  ])("refuses %s", (text, error) => {
    const checked = checkArguments(text, CALCULATE);
    expect(checked.ok).toBe(false);
    expect(checked.ok ? "" : checked.error).toMatch(error);
  });

  it("takes arguments that fit, and any object when the schema is unknown", () => {
    expect(checkArguments('{"expression": "6*7", "precision": 2, "mode": "exact"}', CALCULATE)).toEqual({
      ok: true,
      value: { expression: "6*7", precision: 2, mode: "exact" },
    });
    expect(checkArguments('{"anything": [1]}')).toEqual({ ok: true, value: { anything: [1] } });
  });
});
