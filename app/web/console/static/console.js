// The console's only script. A section marked data-live-seconds is fetched
// again every that many seconds (its live part only, X-Console-Fragment: 1)
// and replaced in place, while the tab is visible. Signed out meanwhile (a
// 401): the page reloads, and lands on the sign-in form.
"use strict";
(function () {
  const live = document.querySelector("[data-live-seconds]");
  if (!live) return;
  const every = Math.max(1, Number(live.dataset.liveSeconds) || 5) * 1000;
  let busy = false;
  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const answer = await fetch(window.location.href, {
        headers: { "X-Console-Fragment": "1" }, credentials: "same-origin", cache: "no-store",
      });
      if (answer.status === 401) { window.location.reload(); return; }
      if (answer.ok) live.innerHTML = await answer.text();
    } catch (e) {
      // The server is away for a moment: keep what is shown, try again later.
    } finally {
      busy = false;
    }
  }
  window.setInterval(refresh, every);
  document.addEventListener("visibilitychange", refresh);
})();
