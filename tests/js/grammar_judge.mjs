// The independent judge of the grammar tests (tests/grammar): validates documents against JSON
// schemas with ajv (draft 2020-12, ajv-formats). Input: a JSON file [{"schema": ..., "docs":
// ["<text>", ...]}]; output on stdout: [[{"valid": bool, "error": "..."}, ...], ...] in order.
// A document that is not JSON is invalid.
import fs from "node:fs";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const cases = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const ajv = new Ajv2020({ strict: false, allErrors: false, validateFormats: true });
addFormats(ajv);
const out = cases.map(({ schema, docs }) => {
  const validate = ajv.compile(schema);
  return docs.map((text) => {
    let value;
    try {
      value = JSON.parse(text);
    } catch (e) {
      return { valid: false, error: "not JSON: " + e.message };
    }
    const valid = validate(value);
    return { valid, error: valid ? "" : ajv.errorsText(validate.errors) };
  });
});
process.stdout.write(JSON.stringify(out));
