// The dev server proxies Parley's routes to `make run`'s server (PARLEY_URL to change it), so the page and
// the API share one origin and Parley needs no CORS setting. `npm run build` writes static files to dist/.
import { defineConfig } from "vite";

const parley = process.env.PARLEY_URL ?? "http://127.0.0.1:8000";

export default defineConfig({
  esbuild: { jsx: "automatic" },
  server: {
    host: "127.0.0.1",
    port: 5173,
    strictPort: true,
    proxy: { "/v1": parley, "/ui": parley },
  },
  build: {
    outDir: "dist",
    emptyOutDir: true,
    rollupOptions: {
      // Harmless in a client-only bundle: swr's "use client" line and zod's comments rollup cannot place.
      onwarn(warning, warn) {
        if (warning.code === "MODULE_LEVEL_DIRECTIVE" || warning.code === "INVALID_ANNOTATION") return;
        warn(warning);
      },
    },
  },
});
