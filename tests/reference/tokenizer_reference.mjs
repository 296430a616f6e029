// Writes tests/data/tokenizer_expected.json: what HF's tokenizers.js (an implementation of
// tokenizer.json independent of tshard) gives for tests/data/tokenizer_texts.json under each
// tests/data/tokenizer_<kind>.json. Run where npm reaches its registry:
//
//   (cd /tmp && npm install @huggingface/tokenizers) && NODE_PATH=/tmp/node_modules \
//     node tests/reference/tokenizer_reference.mjs tests/data
import fs from "fs";
import path from "path";
import { createRequire } from "module";
const require = createRequire(path.join(process.env.NODE_PATH || ".", "x.js"));
const { Tokenizer } = await import(require.resolve("@huggingface/tokenizers").replace(/\.c?js$/, ".mjs"));

const dir = process.argv[2];
const texts = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_texts.json"), "utf8"));
const expected = {};
for (const kind of ["gpt2", "prefix", "llama3", "smollm"]) {
  const json = JSON.parse(fs.readFileSync(path.join(dir, `tokenizer_${kind}.json`), "utf8"));
  const plain = new Tokenizer(json, { clean_up_tokenization_spaces: false });
  const clean = new Tokenizer(json, { clean_up_tokenization_spaces: true });
  const decode = (t, ids, opts) => (ids.length ? t.decode(ids, opts) : "");
  expected[kind] = texts.map((text) => {
    const ids = plain.encode(text).ids;
    return {
      ids,
      ids_no_special: plain.encode(text, { add_special_tokens: false }).ids,
      decoded: decode(plain, ids, {}),
      decoded_skip_special: decode(plain, ids, { skip_special_tokens: true }),
      decoded_clean: decode(clean, ids, {}),
    };
  });
}
fs.writeFileSync(path.join(dir, "tokenizer_expected.json"), JSON.stringify(expected));
