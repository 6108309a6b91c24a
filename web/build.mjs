// Bundles the dashboard: src/main.ts (+ its CSS) -> OUT/assets/app-HASH.{js,css},
// src/favicon.svg -> OUT/assets/favicon-HASH.svg, and src/index.html -> OUT/index.html with
// the hashed names filled in. OUT is $GPUFLEET_WEB_OUT (the collector's build.rs sets it)
// or dist/.
import * as esbuild from 'esbuild';
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';

const out = process.env.GPUFLEET_WEB_OUT || 'dist';
rmSync(out, { recursive: true, force: true });
mkdirSync(join(out, 'assets'), { recursive: true });

const result = await esbuild.build({
  entryPoints: ['src/main.ts'],
  bundle: true,
  minify: true,
  sourcemap: false,
  target: ['es2020'],
  format: 'esm',
  outdir: join(out, 'assets'),
  entryNames: '[name]-[hash]',
  metafile: true,
  logLevel: 'warning',
});

let js, css;
for (const [file, meta] of Object.entries(result.metafile.outputs)) {
  if (meta.entryPoint === 'src/main.ts') js = basename(file);
  else if (file.endsWith('.css')) css = basename(file);
}
if (!js || !css) throw new Error(`esbuild produced no app bundle: ${Object.keys(result.metafile.outputs)}`);

// The icon is linked from index.html, so the browser never asks for /favicon.ico (which
// the collector does not serve): no failed request on any page.
const icon = readFileSync('src/favicon.svg');
const iconName = `favicon-${createHash('sha256').update(icon).digest('hex').slice(0, 8).toUpperCase()}.svg`;
writeFileSync(join(out, 'assets', iconName), icon);

const html = readFileSync('src/index.html', 'utf8')
  .replaceAll('%APP_JS%', `/assets/${js}`)
  .replaceAll('%APP_CSS%', `/assets/${css}`)
  .replaceAll('%FAVICON%', `/assets/${iconName}`);
writeFileSync(join(out, 'index.html'), html);
console.log(`built ${out}: ${js}, ${css}`);
