// The API key of a server started with --api-key: asked for once, when a call first answers 401,
// and kept for the browser session (sessionStorage: this tab only, gone when it closes); every
// call of the chat page and the dashboard goes through apiFetch, which sends it as
// Authorization: Bearer. A refused key is asked for again; a dismissed dialog leaves the call's
// 401 to the page (and is not shown again until the page is reloaded).
'use strict';

const KEY_ITEM = 'dsv41-api-key';
const auth = { asking: null, declined: false };

function withKey(opts) {
  const key = sessionStorage.getItem(KEY_ITEM);
  const o = Object.assign({}, opts || {});
  if (key) o.headers = Object.assign({}, o.headers || {}, { Authorization: `Bearer ${key}` });
  return o;
}

// One dialog for every call that met a 401 meanwhile; resolves to whether a key was given.
function askForKey(message) {
  if (auth.asking) return auth.asking;
  auth.asking = new Promise((resolve) => {
    const d = document.createElement('dialog');
    d.id = 'api-key-dialog';
    const f = document.createElement('form');
    f.method = 'dialog';
    const p = document.createElement('p');
    p.id = 'api-key-message';
    p.textContent = message;
    const input = document.createElement('input');
    Object.assign(input, { type: 'password', id: 'api-key', autocomplete: 'off',
                           placeholder: 'API key' });
    const ok = document.createElement('button');
    Object.assign(ok, { type: 'submit', id: 'api-key-ok', textContent: 'Use this key' });
    f.append(p, input, ok);
    d.append(f);
    document.body.append(d);
    d.addEventListener('close', () => {
      const key = input.value.trim();
      d.remove();
      auth.asking = null;
      if (key) sessionStorage.setItem(KEY_ITEM, key);
      else auth.declined = true;
      resolve(key !== '');
    });
    d.showModal();
    input.focus();
  });
  return auth.asking;
}

async function apiFetch(url, opts) {
  for (;;) {
    const sentKey = sessionStorage.getItem(KEY_ITEM);
    const res = await fetch(url, withKey(opts));
    if (res.status !== 401 || auth.declined) return res;
    // Another call may have stored a new key meanwhile: retry with it before asking.
    if (sessionStorage.getItem(KEY_ITEM) !== sentKey) continue;
    if (sentKey) sessionStorage.removeItem(KEY_ITEM);
    const given = await askForKey(sentKey ? 'That key was refused. API key of this server:'
                                          : 'This server needs an API key:');
    if (!given) return res;
  }
}
