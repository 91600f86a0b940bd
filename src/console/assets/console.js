// The approvals console's only script: countdowns to expiry, and the page kept current while it
// is open (a request decided elsewhere disappears or changes, new ones arrive). The pages work
// without it. Served by the sidecar; no token is ever read or written here.
'use strict';

(function () {
  const LIVE_EVERY_MS = 3000;

  function countdowns() {
    const now = Date.now();
    for (const el of document.querySelectorAll('time[data-countdown]')) {
      if (!el.title) el.title = el.textContent;
      const left = Number(el.dataset.countdown) - now;
      if (left <= 0) {
        el.textContent = 'expired (' + el.title + ')';
        continue;
      }
      const s = Math.floor(left / 1000);
      const h = Math.floor(s / 3600);
      const m = Math.floor((s % 3600) / 60);
      const parts = h > 0 ? [h + 'h', m + 'm'] : m > 0 ? [m + 'm', (s % 60) + 's'] : [(s % 60) + 's'];
      el.textContent = 'in ' + parts.join(' ') + ' (' + el.title + ')';
    }
  }

  let last = null;
  let busy = false;
  async function refresh() {
    const main = document.getElementById('main');
    if (!main || busy || document.hidden) return;
    busy = true;
    try {
      const response = await fetch(location.pathname + location.search, {
        headers: { 'X-Toolgate-Live': '1' },
        credentials: 'same-origin',
        cache: 'no-store',
      });
      if (response.status === 401) {
        location.reload(); // the session ended: the page says so
        return;
      }
      if (!response.ok) return;
      const text = await response.text();
      if (last === null) {
        last = text;
        return;
      }
      if (text === last) return;
      last = text;
      const doc = new DOMParser().parseFromString(text, 'text/html');
      main.replaceChildren(...doc.body.childNodes);
      countdowns();
    } catch (_) {
      // The sidecar is restarting or the network dropped: try again next time.
    } finally {
      busy = false;
    }
  }

  document.addEventListener('DOMContentLoaded', () => {
    countdowns();
    setInterval(countdowns, 1000);
    if (document.getElementById('main') && document.querySelector('header nav')) {
      refresh();
      setInterval(refresh, LIVE_EVERY_MS);
    }
  });
})();
