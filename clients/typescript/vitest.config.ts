import { defineConfig } from "vitest/config";

// The live suite starts a real server; the machine is shared, so its waits are generous (no speed targets here).
export default defineConfig({
  test: { testTimeout: 60_000, hookTimeout: 60_000, include: ["test/**/*.test.ts"] },
});
