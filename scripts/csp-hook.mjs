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
// A release build also minifies wasm-bindgen's JavaScript glue with terser (Trunk's own
// minifier cannot parse it and leaves it whole): local names only, never a property or an
// export, so the glue's imports of the WebAssembly module keep their names. The file's
// Subresource Integrity hash in index.html is written anew for the minified bytes.
import { createHash } from 'node:crypto';
import { readdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { minify } from 'terser';

const staging = process.env.TRUNK_STAGING_DIR;
if (!staging) throw new Error('TRUNK_STAGING_DIR is not set: run this as a Trunk hook');
const file = join(staging, 'index.html');
let html = await readFile(file, 'utf8');

if (process.env.TRUNK_PROFILE === 'release') {
  for (const name of (await readdir(staging)).filter((n) => n.endsWith('.js'))) {
    const path = join(staging, name);
    const glue = await readFile(path, 'utf8');
    const { code } = await minify(glue, { module: true, compress: true, mangle: true });
    if (!code) throw new Error(`terser returned nothing for ${name}`);
    await writeFile(path, code);
    const sri = `sha384-${createHash('sha384').update(code).digest('base64')}`;
    // the modulepreload link of this file (the inline loader names it too, without one)
    const tag = html.search(new RegExp(`href="?\\./${name.replaceAll('.', '\\.')}`));
    const end = html.indexOf('>', tag);
    const attr = /integrity=("?)sha384-[A-Za-z0-9+/=]+\1/.exec(html.slice(tag, end));
    if (tag < 0 || !attr) throw new Error(`no integrity attribute for ${name} in index.html`);
    const at = tag + attr.index;
    html = `${html.slice(0, at)}integrity=${attr[1]}${sri}${attr[1]}${html.slice(at + attr[0].length)}`;
    console.log(`${name}: ${glue.length} -> ${code.length} characters (terser)`);
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
