// Trunk post-build hook: writes the Content-Security-Policy into the staged index.html.
// The policy allows only the page's own origin, and for connections one host more: the
// Hugging Face Hub, whose `config.json` the page fetches when a person clicks "Fetch" by a
// Hub id. Only https://huggingface.co itself: the Hub redirects within it (a renamed
// repository) and serves a small text file such as config.json from it; the hosts it
// redirects large (LFS / Xet) files to are not allowed, so such a redirect fails like no
// network, and the page says so. Trunk's inline loader script is allowed by its SHA-256
// hash (it changes with every build), never by 'unsafe-inline'. A release build minifies
// index.html (Trunk.toml), which drops the quotes around attribute values.
import { createHash } from 'node:crypto';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

const staging = process.env.TRUNK_STAGING_DIR;
if (!staging) throw new Error('TRUNK_STAGING_DIR is not set: run this as a Trunk hook');
const file = join(staging, 'index.html');
let html = await readFile(file, 'utf8');

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
