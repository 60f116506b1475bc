import { defineConfig } from "vite";

// The page calls CopilotKit's runtime (server.mjs, 127.0.0.1:4000 unless RUNTIME_URL says otherwise) on its
// own origin and vite forwards it, SSE answers too, so the runtime needs no CORS. /ui and /v1 go to Parley
// (PARLEY_URL, `make run` on 127.0.0.1:8000) for its own page on the same session.
const runtime = process.env.RUNTIME_URL ?? "http://127.0.0.1:4000";
const parley = process.env.PARLEY_URL ?? "http://127.0.0.1:8000";
const proxy = { "/api/copilotkit": { target: runtime }, "/v1": { target: parley }, "/ui": { target: parley } };

export default defineConfig({
  // CopilotKit's chat with its markdown, code and math renderers is several MB: fine for an example.
  build: {
    chunkSizeWarningLimit: 20000,
    // Radix's "use client" lines are for React server components; a page bundle has no use for them.
    rolldownOptions: {
      onwarn: (warning, warn) => warning.code === "MODULE_LEVEL_DIRECTIVE" || warn(warning),
    },
  },
  server: { port: 5174, strictPort: true, proxy },
  preview: { port: 4174, strictPort: true, proxy },
});
