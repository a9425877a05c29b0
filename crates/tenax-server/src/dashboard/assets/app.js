// The Tenax dashboard: asks for a token, keeps it for this browser tab only
// (sessionStorage), fetches HTML fragments rendered by the server with it, swaps them
// in, refreshes them every few seconds, and posts operator actions to the JSON API.
// The server escapes everything in the fragments; this script inserts no data of its
// own as HTML.
'use strict';

(function () {
  const KEY = 'tenax.token';
  const REFRESH_MS = 5000;

  const view = document.getElementById('view');
  const nav = document.getElementById('nav');
  const login = document.getElementById('login');
  const tokenInput = document.getElementById('token');
  const loginError = document.getElementById('login-error');
  const message = document.getElementById('message');
  const who = document.getElementById('who');
  const signout = document.getElementById('signout');
  const updated = document.getElementById('updated');

  let signedIn = false;
  let loading = false;

  function token() {
    return sessionStorage.getItem(KEY);
  }

  function headers() {
    const t = token();
    return t ? { Authorization: 'Bearer ' + t } : {};
  }

  // The fragment URL of the current location hash.
  function fragmentUrl() {
    const hash = location.hash.replace(/^#/, '') || 'overview';
    const [path, query] = hash.split('?', 2);
    const q = query ? '?' + new URLSearchParams(query).toString() : '';
    let m;
    if ((m = /^task\/(\d+)$/.exec(path))) return '/ui/tasks/' + m[1];
    if ((m = /^workflow\/(\d+)$/.exec(path))) return '/ui/workflows/' + m[1];
    switch (path) {
      case 'queues': return '/ui/queues';
      case 'tasks': return '/ui/tasks' + q;
      case 'dead': return '/ui/dead';
      case 'schedules': return '/ui/schedules';
      case 'workflows': return '/ui/workflows';
      case 'audit': return '/ui/audit';
      default: return '/ui/overview';
    }
  }

  function say(text, isError) {
    message.textContent = text;
    message.className = isError ? 'error' : '';
  }

  async function errorText(response) {
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) return body.error.message;
    } catch (_) { /* not JSON */ }
    return 'HTTP ' + response.status;
  }

  function showLogin(reason) {
    signedIn = false;
    nav.hidden = true;
    signout.hidden = true;
    who.textContent = '';
    view.replaceChildren();
    login.hidden = false;
    loginError.textContent = reason || '';
    tokenInput.focus();
  }

  function showSignedIn(fragment) {
    signedIn = true;
    login.hidden = true;
    nav.hidden = false;
    signout.hidden = !token();
    if (fragment) {
      who.textContent = fragment.dataset.actor + ' (' + fragment.dataset.role + ')';
    }
    for (const link of nav.querySelectorAll('a')) {
      const current = (location.hash || '#overview').startsWith(link.getAttribute('href'));
      link.classList.toggle('current', current);
    }
  }

  // Someone is typing in a form: a refresh would throw their input away.
  function editing() {
    const active = document.activeElement;
    return active && view.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName);
  }

  async function load(background) {
    if (loading || (background && (document.hidden || !signedIn || editing()))) return;
    loading = true;
    try {
      let response;
      try {
        response = await fetch(fragmentUrl(), { headers: headers(), cache: 'no-store', credentials: 'omit' });
      } catch (_) {
        say('The server cannot be reached; retrying.', true);
        return;
      }
      if (response.status === 401) {
        const hadToken = Boolean(token());
        sessionStorage.removeItem(KEY);
        showLogin(hadToken ? 'The token was refused: ' + (await errorText(response)) : '');
        return;
      }
      if (response.status === 403) {
        sessionStorage.removeItem(KEY);
        showLogin('This token may not read the dashboard (it needs role read or admin).');
        return;
      }
      if (!response.ok) {
        say(await errorText(response), true);
        return;
      }
      const html = await response.text();
      if (background && editing()) return;
      // The fragment is the server's escaped HTML; scripts in it would not run (the
      // page's policy allows none inline).
      view.innerHTML = html;
      showSignedIn(view.querySelector('.fragment'));
      if (!background) say('', false);
      updated.textContent = 'Updated ' + new Date().toLocaleTimeString() + '.';
    } finally {
      loading = false;
    }
  }

  login.addEventListener('submit', function (event) {
    event.preventDefault();
    const value = tokenInput.value.trim();
    if (!value) return;
    sessionStorage.setItem(KEY, value);
    tokenInput.value = '';
    load(false);
  });

  signout.addEventListener('click', function () {
    sessionStorage.removeItem(KEY);
    showLogin('Signed out.');
  });

  // The task filters: their values become the location hash.
  view.addEventListener('submit', function (event) {
    const form = event.target;
    if (form.id !== 'filters') return;
    event.preventDefault();
    const params = new URLSearchParams();
    for (const [name, value] of new FormData(form)) {
      if (String(value).trim()) params.set(name, String(value).trim());
    }
    const query = params.toString();
    document.activeElement.blur();
    location.hash = 'tasks' + (query ? '?' + query : '');
  });

  // Operator actions: POST to the JSON API with the token, then reload the view.
  view.addEventListener('click', async function (event) {
    const button = event.target.closest('button.action');
    if (!button || !view.contains(button)) return;
    const url = button.dataset.url || '';
    if (!/^\/v1\//.test(url)) return;
    if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
    button.disabled = true;
    try {
      const response = await fetch(url, { method: 'POST', headers: headers(), cache: 'no-store', credentials: 'omit' });
      if (response.ok) {
        say(button.textContent + ': done.', false);
      } else {
        say(button.textContent + ' failed: ' + (await errorText(response)), true);
      }
    } catch (_) {
      say(button.textContent + ' failed: the server cannot be reached.', true);
    }
    await load(false);
  });

  window.addEventListener('hashchange', function () { load(false); });
  setInterval(function () { load(true); }, REFRESH_MS);

  // A server without tokens (loopback only) answers without one; otherwise ask.
  load(false);
})();
