// Builds the reference page into app/ui/ (committed, so the service and its image need no Node):
// ui/main.ts with the client bundled by esbuild, the page's HTML, CSS and icons, and Swagger UI's own assets from
// swagger-ui-dist for /docs. `--check` builds in memory and fails if a committed file differs.
import { build } from "esbuild";
import { mkdirSync, readFileSync, writeFileSync, existsSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const pkg = join(here, "..");
const out = join(pkg, "..", "..", "app", "ui");
const check = process.argv.includes("--check");

const bundle = await build({
  entryPoints: [join(pkg, "ui", "main.ts")],
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  legalComments: "eof",
  write: false,
  logLevel: "warning",
});
const swagger = join(pkg, "node_modules", "swagger-ui-dist");
const files = new Map([
  ["index.html", readFileSync(join(pkg, "ui", "index.html"))],
  ["assets/parley.js", Buffer.from(bundle.outputFiles[0].contents)],
  ["assets/parley.css", readFileSync(join(pkg, "ui", "style.css"))],
  ["assets/parley.svg", readFileSync(join(pkg, "ui", "parley.svg"))],
  // Made from parley.svg by scripts/favicon.py (chromium renders it); served at /favicon.ico.
  ["favicon.ico", readFileSync(join(pkg, "ui", "favicon.ico"))],
  ["swagger/swagger-ui-bundle.js", readFileSync(join(swagger, "swagger-ui-bundle.js"))],
  ["swagger/swagger-ui.css", readFileSync(join(swagger, "swagger-ui.css"))],
  ["swagger/favicon-32x32.png", readFileSync(join(swagger, "favicon-32x32.png"))],
  ["swagger/LICENSE", readFileSync(join(swagger, "LICENSE"))],
]);

let stale = 0;
for (const [name, content] of files) {
  const path = join(out, name);
  if (check) {
    if (!existsSync(path) || !readFileSync(path).equals(content)) {
      console.error(`stale: ${relative(process.cwd(), path)} (run make ui)`);
      stale += 1;
    }
  } else {
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, content);
  }
}
if (stale) process.exit(1);
console.log(check ? "app/ui is up to date" : `wrote ${files.size} files to app/ui`);
