// Image input with the official `openai` npm client against a running server on the tiny random
// model (a vision tower of its own). Usage:
//   node image_input_test.mjs BASE_URL MODEL MODE IMAGE_FILE SPAN [IMAGE_URL]
// MODE "basic": a chat completion with a text part and an image_url part (a data: URL of
// IMAGE_FILE) is answered; its prompt counts SPAN tokens more than the text alone (the image
// placeholder became a span of SPAN positions); the same request twice gives the same greedy
// answer, which differs from the text-only one's logprobs; an http URL (the server without
// --allow-image-urls: the message names it) and a corrupt image are BadRequestErrors naming the part.
// MODE "urls" (a server run with --allow-image-urls): IMAGE_URL, an http URL serving IMAGE_FILE,
// gives the data: URL's answer and usage; an http URL answering 404 (IMAGE_URL with "/missing" for
// its path) is a BadRequestError naming the part.
import fs from 'node:fs';
import OpenAI from 'openai';
import { check, expectError, runMode } from './check.mjs';

const [base, model, mode, imageFile, spanArg, imageUrl] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const span = Number(spanArg);
const dataUrl = `data:image/png;base64,${fs.readFileSync(imageFile).toString('base64')}`;

const ask = (parts) =>
  client.chat.completions.create({
    model, max_tokens: 6, temperature: 0, logprobs: true,
    messages: [{ role: 'user', content: parts }],
  });

await runMode(mode, {
  async basic() {
    const text = { type: 'text', text: 'What is in the picture?' };
    const image = { type: 'image_url', image_url: { url: dataUrl } };
    const withImage = await ask([text, image]);
    const again = await ask([text, image]);
    const textOnly = await ask([text]);
    check(withImage.choices[0].finish_reason === 'length', 'the image request is answered');
    check(withImage.usage.prompt_tokens - textOnly.usage.prompt_tokens === span,
          `the image counts as its span of ${span} (${withImage.usage.prompt_tokens} vs ` +
          `${textOnly.usage.prompt_tokens} prompt tokens)`);
    check(JSON.stringify(withImage.choices) === JSON.stringify(again.choices),
          'the same image request gives the same greedy answer');
    const lp = (r) => JSON.stringify(r.choices[0].logprobs.content.map((t) => t.logprob));
    check(lp(withImage) !== lp(textOnly), 'the image changes the answer\'s logprobs');
    await expectError(ask([text, { type: 'image_url', image_url: { url: 'https://example.com/a.png' } }]),
      OpenAI.BadRequestError, 400, 'an http URL is refused',
      (e) => check(e.param === 'messages[0].content[1].image_url' &&
                   e.message.includes('--allow-image-urls'),
                   `the part and the flag are named (${e.param}: ${e.message})`));
    await expectError(ask([{ type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } }]),
      OpenAI.BadRequestError, 400, 'a corrupt image is refused',
      (e) => check(e.param === 'messages[0].content[0].image_url', `the part is named (${e.param})`));
  },
  async urls() {
    const text = { type: 'text', text: 'What is in the picture?' };
    const byData = await ask([text, { type: 'image_url', image_url: { url: dataUrl } }]);
    const byUrl = await ask([text, { type: 'image_url', image_url: { url: imageUrl } }]);
    check(byUrl.usage.prompt_tokens === byData.usage.prompt_tokens,
          `the fetched image counts as the data: URL's (${byUrl.usage.prompt_tokens} vs ` +
          `${byData.usage.prompt_tokens} prompt tokens)`);
    check(JSON.stringify(byUrl.choices) === JSON.stringify(byData.choices),
          'the fetched image gives the data: URL\'s answer');
    const missing = new URL(imageUrl);
    missing.pathname = '/missing';
    await expectError(ask([text, { type: 'image_url', image_url: { url: missing.href } }]),
      OpenAI.BadRequestError, 400, 'a URL answering 404 is refused',
      (e) => check(e.param === 'messages[0].content[1].image_url' && e.message.includes('404'),
                   `the part and the status are named (${e.param}: ${e.message})`));
  },
});
