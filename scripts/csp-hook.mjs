// Trunk post-build hook: writes the Content-Security-Policy into the staged index.html.
// The policy allows only the page's own origin, and for connections one host more: the
// Hugging Face Hub, whose `config.json` the page fetches when a person clicks "Fetch" by a
// Hub id. Only https://huggingface.co itself: the Hub redirects within it (a renamed
// repository) and serves a small text file such as config.json from it; the hosts it
// redirects large (LFS / Xet) files to are not allowed, so such a redirect fails like no
// network, and the page says so. Trunk's inline loader script is allowed by its SHA-256
// hash (it changes with every build), never by 'unsafe-inline'. A release build minifies
// index.html (Trunk.toml), which drops the quotes around attribute values.
//
// A release build also shrinks what the WebAssembly module and its JavaScript glue share:
// binaryen renames the module's imports and exports (wasm-bindgen's names carry a hash each)
// and the glue is rewritten with its mapping, then minified with terser (Trunk's own
// minifier cannot parse it and leaves it whole). The files' Subresource Integrity hashes in
// index.html are written anew.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { minify } from 'terser';

const staging = process.env.TRUNK_STAGING_DIR;
if (!staging) throw new Error('TRUNK_STAGING_DIR is not set: run this as a Trunk hook');
const file = join(staging, 'index.html');
let html = await readFile(file, 'utf8');

/** Writes the Subresource Integrity hash of `name` (now `bytes`) into its link in `html`. */
function withIntegrity(html, name, bytes) {
  const sri = `sha384-${createHash('sha384').update(bytes).digest('base64')}`;
  // the file's own link (the inline loader names the files too, without a hash)
  const tag = html.search(new RegExp(`href="?\\./${name.replaceAll('.', '\\.')}`));
  const end = html.indexOf('>', tag);
  const attr = /integrity=("?)sha384-[A-Za-z0-9+/=]+\1/.exec(html.slice(tag, end));
  if (tag < 0 || !attr) throw new Error(`no integrity attribute for ${name} in index.html`);
  const at = tag + attr.index;
  return `${html.slice(0, at)}integrity=${attr[1]}${sri}${attr[1]}${html.slice(at + attr[0].length)}`;
}

/** `source`, an ES module (the file `name`), minified by terser. */
async function minified(source, name) {
  const { code } = await minify(source, { module: true, compress: true, mangle: true });
  if (!code) throw new Error(`terser returned nothing for ${name}`);
  return code;
}

// (KEEP_GLUE=1 keeps the names, for a profile of the bundle's functions)
if (process.env.TRUNK_PROFILE === 'release' && !process.env.KEEP_GLUE) {
  const files = await readdir(staging);
  const wasmName = files.find((n) => n.endsWith('_bg.wasm'));
  // (the glue is named after the module)
  const jsName = wasmName && wasmName.replace(/_bg\.wasm$/, '.js');
  if (jsName && !files.includes(jsName)) throw new Error(`no glue ${jsName} in the staging folder`);
  if (!wasmName || !jsName) throw new Error('no wasm-bindgen output in the staging folder');
  let glue = await readFile(join(staging, jsName), 'utf8');
  const before = glue.length;
  // The names the module and its glue share (wasm-bindgen's import names carry a 16-digit
  // hash each) minified on both sides: binaryen renames them and prints the mapping.
  const wasmPath = join(staging, wasmName);
  const mapping = JSON.parse(
    execFileSync(join(process.cwd(), 'node_modules', '.bin', 'wasm-opt'), [
      wasmPath, '-o', wasmPath, '--minify-imports-and-exports-and-modules',
      '--enable-bulk-memory', '--enable-bulk-memory-opt', '--enable-nontrapping-float-to-int',
      '--enable-sign-ext', '--enable-mutable-globals', '--enable-reference-types',
      '--enable-multivalue',
    ], { encoding: 'utf8' }),
  );
  const modules = new Set(mapping.imports.map(([module]) => module));
  if (modules.size !== 1) throw new Error(`imports from ${modules.size} modules`);
  const [module] = modules;
  const imports = new Map(mapping.imports.map(([, from, to]) => [from, to]));
  const exports = new Map(mapping.exports);
  glue = glue.replaceAll(`"${module}": import0`, '"a": import0');
  glue = glue.replace(/^(\s+)(\w+)(: function)/gm, (all, indent, name, rest) =>
    imports.has(name) ? `${indent}${imports.get(name)}${rest}` : all,
  );
  glue = glue.replace(/\bwasm\.(\w+)/g, (all, name) =>
    exports.has(name) ? `wasm.${exports.get(name)}` : all,
  );
  const left = [...imports.keys(), ...exports.keys()].filter(
    (name) => name.startsWith('__wbg') && glue.includes(name),
  );
  if (left.length > 0) throw new Error(`names left unmapped in the glue: ${left.join(', ')}`);
  // wasm-streams' classes (Leptos' server functions, unused here), whose exports the
  // wasm-opt step of index.html removed
  glue = glue.replace(/^export class IntoUnderlying\w+ \{\n[\s\S]*?^\}\n/gm, '');
  glue = glue.replace(/^if \(Symbol\.dispose\) IntoUnderlying\w+\.prototype.*\n/gm, '');
  glue = glue.replace(/^const IntoUnderlying\w+Finalization = [\s\S]*?;\n/gm, '');
  const code = await minified(glue, jsName);
  await writeFile(join(staging, jsName), code);
  html = withIntegrity(html, jsName, code);
  html = withIntegrity(html, wasmName, await readFile(wasmPath));
  console.log(`${jsName}: ${before} -> ${code.length} characters; ${imports.size} imports, ${exports.size} exports renamed`);
}

// wasm-bindgen's snippets (src/worker.js, the advisor's worker), minified too.
if (process.env.TRUNK_PROFILE === 'release') {
  const snippets = join(staging, 'snippets');
  const scripts = (await readdir(snippets, { recursive: true }).catch(() => []))
    .filter((name) => name.endsWith('.js'));
  for (const name of scripts) {
    const path = join(snippets, name);
    const code = await minified(await readFile(path, 'utf8'), path);
    await writeFile(path, code);
    // (Trunk preloads each snippet with its hash)
    if (html.includes(`snippets/${name}`)) html = withIntegrity(html, `snippets/${name}`, code);
  }
}

const hashes = [...html.matchAll(/<script type="?module"?>([\s\S]*?)<\/script>/g)].map(
  ([, body]) => `'sha256-${createHash('sha256').update(body).digest('base64')}'`,
);
if (hashes.length === 0) throw new Error('no inline loader script found in index.html');

const policy = [
  "default-src 'self'",
  `script-src 'self' 'wasm-unsafe-eval' ${hashes.join(' ')}`,
  "style-src 'self'",
  "img-src 'self' data:",
  "connect-src 'self' https://huggingface.co",
  "font-src 'self'",
  "object-src 'none'",
  "base-uri 'none'",
  "form-action 'none'",
].join('; ');

const placeholder = /content=("?)__CONTENT_SECURITY_POLICY__\1/;
if (!placeholder.test(html)) throw new Error('no __CONTENT_SECURITY_POLICY__ in index.html');
html = html.replace(placeholder, () => `content="${policy}"`);
await writeFile(file, html);
console.log(`CSP written (${hashes.length} inline script hash)`);
