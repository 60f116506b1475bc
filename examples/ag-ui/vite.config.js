import { defineConfig } from "vite";

// Parley (`make run`) on 127.0.0.1:8000 unless PARLEY_URL says otherwise. The page calls /v1 on its own
// origin and vite forwards it (the SSE answers too), so Parley needs no CORS setting for it; /ui is
// Parley's own page, for the same session.
const target = process.env.PARLEY_URL ?? "http://127.0.0.1:8000";
const proxy = { "/v1": { target }, "/ui": { target } };

export default defineConfig({
  // AG-UI's client with its schemas (zod) and rxjs is most of the ~500 kB: one chunk is fine for an example.
  build: { chunkSizeWarningLimit: 700 },
  server: { port: 5173, strictPort: true, proxy },
  preview: { port: 4173, strictPort: true, proxy },
});
