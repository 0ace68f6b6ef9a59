// Image input with the official `@anthropic-ai/sdk` client (Messages API) against a running server
// on the tiny random model (a vision tower of its own). Usage:
//   node anthropic_image_test.mjs BASE_URL MODEL MODE IMAGE_FILE SPAN
// MODE "basic": a user message with a text block and an image block (base64 source of the PNG
// IMAGE_FILE) is answered and counts SPAN input tokens more than the text alone; the same request
// twice gives the same answer at temperature 0; a corrupt image and an image in an assistant
// message are 400 invalid_request_errors.
import fs from 'node:fs';
import Anthropic from '@anthropic-ai/sdk';
import { check, expectError, runMode } from './check.mjs';

const [base, model, mode, imageFile, spanArg] = process.argv.slice(2);
const client = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const span = Number(spanArg);
const png = fs.readFileSync(imageFile).toString('base64');
const image = (data) => ({ type: 'image', source: { type: 'base64', media_type: 'image/png', data } });
const text = { type: 'text', text: 'What is in the picture?' };
const ask = (content, role = 'user') =>
  client.messages.create({
    model, max_tokens: 6, temperature: 0,
    messages: role === 'user' ? [{ role, content }]
                              : [{ role: 'user', content: 'hi' }, { role, content }],
  });

await runMode(mode, {
  async basic() {
    const withImage = await ask([text, image(png)]);
    const again = await ask([text, image(png)]);
    const textOnly = await ask([text]);
    check(withImage.stop_reason === 'max_tokens', 'the image message is answered');
    // (input_tokens leaves out what the prefix cache held: the text-only prompt's cached part)
    const total = (u) => u.input_tokens + (u.cache_read_input_tokens ?? 0);
    check(total(withImage.usage) - total(textOnly.usage) === span,
          `the image counts as its span of ${span} (${total(withImage.usage)} vs ` +
          `${total(textOnly.usage)} input tokens)`);
    check(JSON.stringify(withImage.content) === JSON.stringify(again.content),
          'the same image message gives the same answer at temperature 0');
    await expectError(ask([text, image('iVBORw0KGgo=')]), Anthropic.BadRequestError, 400,
      'a corrupt image is refused');
    await expectError(ask([image(png)], 'assistant'), Anthropic.BadRequestError, 400,
      'an image in an assistant message is refused');
  },
});
