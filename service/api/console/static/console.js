// webhook-inbox console: refreshes the parts of a page marked data-refresh-url in place, every
// data-refresh-seconds. Not while the tab is hidden, nor while the keyboard focus is inside
// the part (it would be lost). A part that comes back without data-refresh-url stops.
// A table body marked data-stream-url gets a row on top for each Server-Sent Event of that
// URL (the live view), written as text, never as markup.
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

  const KINDS = ["accepted", "duplicate", "processed", "failed", "dead"];
  const MAX_ROWS = 500;

  function cell(row, text, href) {
    const td = row.insertCell();
    if (href) {
      const a = document.createElement("a");
      a.href = href;
      a.textContent = text;
      td.appendChild(a);
    } else {
      td.textContent = text;
    }
    return td;
  }

  function what(event) {
    if (event.attempt !== null) {
      return event.kind + " (attempt " + event.attempt +
        (event.destination ? ", " + event.destination : "") + ")";
    }
    if (event.deliveries !== null) {
      return event.kind + " (delivery " + event.deliveries + ")";
    }
    return event.kind;
  }

  function follow(body) {
    const state = document.querySelector("[data-stream-state]");
    const source = new EventSource(body.dataset.streamUrl);
    source.onopen = function () {
      if (state) { state.textContent = "Following: new events appear at the top."; }
    };
    source.onerror = function () {
      if (state) { state.textContent = "Reconnecting…"; }
    };
    KINDS.forEach(function (kind) {
      source.addEventListener(kind, function (message) {
        const event = JSON.parse(message.data);
        const link = "/console/messages/" + event.id;
        const row = body.insertRow(0);
        row.className = "event-" + event.kind;
        cell(row, new Date(event.at).toISOString().replace("T", " ").slice(0, 19) + " UTC");
        cell(row, event.source);
        cell(row, String(event.id), link);
        cell(row, event.message_id, link).className = "mono";
        cell(row, event.event_type || "—");
        const status = document.createElement("span");
        status.className = "status status-" + event.kind;
        status.textContent = what(event);
        row.insertCell().appendChild(status);
        const error = event.error_type ? event.error_type + ": " + (event.error || "") : "";
        cell(row, error).className = "error-cell";
        while (body.rows.length > MAX_ROWS) {
          body.deleteRow(body.rows.length - 1);
        }
      });
    });
  }

  document.querySelectorAll("[data-stream-url]").forEach(follow);
})();
