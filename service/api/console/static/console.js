// webhook-inbox console: refreshes the parts of a page marked data-refresh-url in place, every
// data-refresh-seconds. Not while the tab is hidden, nor while the keyboard focus is inside
// the part (it would be lost). A part that comes back without data-refresh-url stops.
"use strict";

(function () {
  function watch(part) {
    const seconds = Number(part.dataset.refreshSeconds) || 5;
    window.setTimeout(function () { refresh(part); }, seconds * 1000);
  }

  async function refresh(part) {
    if (!part.isConnected) {
      return;
    }
    if (document.hidden || part.contains(document.activeElement)) {
      watch(part);
      return;
    }
    let fresh = null;
    try {
      const response = await fetch(part.dataset.refreshUrl, {
        credentials: "same-origin",
        cache: "no-store",
        headers: { Accept: "text/html" },
      });
      if (response.status === 401) {
        // The session ended: reloading shows the sign-in form.
        window.location.reload();
        return;
      }
      if (response.ok) {
        const template = document.createElement("template");
        template.innerHTML = (await response.text()).trim();
        fresh = template.content.firstElementChild;
      }
    } catch (error) {
      fresh = null; // the service is restarting or unreachable: keep what is shown, try again
    }
    if (fresh && part.isConnected) {
      part.replaceWith(fresh);
      if (fresh.dataset.refreshUrl) {
        watch(fresh);
      }
    } else {
      watch(part);
    }
  }

  document.querySelectorAll("[data-refresh-url]").forEach(watch);
})();
