/*
 * Effectgate console behaviour. Loaded with `defer` from console/base.html after htmx.
 *
 * The console has no inline <script>, no inline event handlers (onclick=...), no hx-on
 * attributes and no htmx [filter] expressions: all of those need 'unsafe-inline' or
 * 'unsafe-eval' under a Content-Security-Policy. base.html also turns htmx's eval off
 * (htmx-config allowEval: false), so such attributes would not run anyway. Behaviour
 * belongs here, attached by data-* attributes.
 *
 * 1. Keyboard list navigation
 *    <table class="data" data-keynav aria-keyshortcuts="j k Enter"> with one <tr> per
 *    item, optionally <tr data-key="op_123"> (otherwise the row's first link is its key).
 *    j / k move the current row (class "is-current", aria-current="true") and focus its
 *    first link; Enter opens that link. Keys typed into inputs, textareas, selects and
 *    editable content are ignored, as are keys with Ctrl / Alt / Meta. The current row
 *    survives htmx swaps of the table. Announce the keys next to the table:
 *    {% include "console/_shared.html#keynav-help" %}.
 *    "/" focuses the header search box (input[data-shortcut="/"]).
 *    "x" ticks or unticks the current row's checkbox (input[data-select]); ticked
 *    boxes stay ticked when polling replaces the rows.
 *    On a decision form (<form data-decide>), "a" focuses the Approve button
 *    ([data-shortcut="a"]; Enter then presses it) and "r" the comment
 *    ([data-shortcut="r"]); #decide-hint says what Enter will do. In the inbox, once
 *    rows are ticked, "a" and "r" do the same in the bulk bar (<form data-bulk>).
 *    On the operation page's answer form, "h", "n" and "u" choose an answer
 *    (input[data-answer-key]) and focus the field it needs (data-answer-focus).
 *
 * 2. Polling pauses while the tab is hidden
 *    Live regions poll with
 *        hx-get="..." hx-trigger="every 5s, refresh"
 *    A request that a poll fires (`every`, which carries no triggering event) is
 *    cancelled in htmx:beforeRequest while document.hidden; htmx keeps its poll timer,
 *    so polling resumes by itself. When the tab becomes visible again, every polling
 *    element gets a "refresh" event, so a region that names `refresh` in its hx-trigger
 *    updates at once instead of at its next tick. (htmx's own filter syntax,
 *    `every 5s [!document.hidden]`, would do the first half but compiles the filter with
 *    Function(), which a CSP without 'unsafe-eval' forbids; so it is not used.)
 *
 * 4. The inbox's bulk bar and the phone menu (end of this file)
 *    <form data-bulk> shows only while a row is ticked and says how many
 *    ([data-bulk-count]); without JavaScript it is always shown. A button
 *    [data-menu-toggle] opens and closes the header's menu on narrow screens
 *    (aria-expanded; console.css hides the menu only once html has class "js").
 *
 * 3. Relative times
 *    <time datetime="2025-01-02T03:04:05Z" title="2025-01-02 03:04:05 UTC" data-relative>
 *    (from {{ value|reltime }}) shows "3 min ago" / "in 2 h"; the title keeps the
 *    absolute time. Refreshed every 30 s, after htmx swaps and when the tab shows again.
 *    A time in the past gets data-past (pages may style e.g. an expired deadline).
 */
(function () {
  "use strict";

  // ---------------------------------------------------------------- 1. keynav

  const CURRENT = "is-current";
  const CONTROLS =
    "a[href], button, summary, [role='button'], [role='link'], [tabindex]:not([tabindex='-1'])";
  let currentKey = null;

  function isTyping(target) {
    if (!(target instanceof Element)) return false;
    if (target.isContentEditable) return true;
    const tag = target.tagName;
    if (tag === "INPUT") {
      // Ticking a box or pressing a button is not typing: the keys keep working.
      const type = (target.getAttribute("type") || "text").toLowerCase();
      return ["checkbox", "radio", "button", "submit", "reset"].indexOf(type) === -1;
    }
    return tag === "TEXTAREA" || tag === "SELECT";
  }

  function keynavTable() {
    const active = document.activeElement;
    const owner = active && active.closest && active.closest("table[data-keynav]");
    return owner || document.querySelector("table[data-keynav]");
  }

  function rowsOf(table) {
    const rows = [];
    for (const body of table.tBodies) {
      for (const row of body.rows) {
        if (!row.hidden && !row.classList.contains("empty")) rows.push(row);
      }
    }
    return rows;
  }

  function firstLink(row) {
    return row.querySelector("a[href]");
  }

  function rowKey(row) {
    if (row.dataset.key) return row.dataset.key;
    const link = firstLink(row);
    return link ? link.getAttribute("href") : null;
  }

  function markCurrent(table, row) {
    for (const other of table.querySelectorAll("tr." + CURRENT)) {
      other.classList.remove(CURRENT);
      other.removeAttribute("aria-current");
    }
    if (!row) return;
    row.classList.add(CURRENT);
    row.setAttribute("aria-current", "true");
    currentKey = rowKey(row);
  }

  function moveTo(table, row) {
    markCurrent(table, row);
    const target = firstLink(row) || row;
    if (target === row && !row.hasAttribute("tabindex")) row.tabIndex = -1;
    target.focus({ preventScroll: true });
    row.scrollIntoView({ block: "nearest" });
  }

  function onKeynavKey(event) {
    const table = keynavTable();
    if (!table) return false;
    const rows = rowsOf(table);
    if (rows.length === 0) return false;
    const current = table.querySelector("tbody tr." + CURRENT);
    const index = current ? rows.indexOf(current) : -1;

    if (event.key === "j" || event.key === "k") {
      let next;
      if (index === -1) next = event.key === "j" ? 0 : rows.length - 1;
      else next = Math.min(rows.length - 1, Math.max(0, index + (event.key === "j" ? 1 : -1)));
      moveTo(table, rows[next]);
      return true;
    }

    if (event.key === "Enter" && current) {
      // A focused link, button or other control does its own thing on Enter.
      // (tabindex="-1" containers such as <main id="main"> are not controls.)
      const target = event.target;
      if (target instanceof Element && target !== current && target.closest(CONTROLS)) {
        return false;
      }
      const link = firstLink(current);
      if (!link) return false;
      link.click();
      return true;
    }
    return false;
  }

  function focusSearch() {
    const box = document.querySelector("input[data-shortcut='/']");
    if (!box) return false;
    // On a phone the search sits in the closed menu: open it first.
    const toggle = document.querySelector("[data-menu-toggle][aria-expanded='false']");
    if (box.offsetParent === null && toggle) toggle.click();
    box.focus();
    box.select();
    return true;
  }

  function toggleSelected() {
    const table = keynavTable();
    const row = table && table.querySelector("tr." + CURRENT);
    const box = row && row.querySelector("input[data-select]");
    if (!box) return false;
    box.checked = !box.checked;
    box.dispatchEvent(new Event("change", { bubbles: true }));
    return true;
  }

  // An approval page whose request someone else decided (or that was withdrawn or
  // expired) while it was open: its polled status region says so, and the decision
  // buttons are disabled, so a stale page cannot be decided on. The comment typed so
  // far stays.
  function disableStaleDecisions() {
    const live = document.getElementById("approval-live");
    if (!live || live.getAttribute("data-live-pending") !== "false") return;
    document.querySelectorAll("form[data-decide] button[type='submit']").forEach(function (b) {
      b.disabled = true;
    });
  }
  document.addEventListener("htmx:afterSettle", disableStaleDecisions);

  // The operation page likewise: once its polled status region reports another state
  // (or another event) than the page was rendered with, the forms that act on the state
  // (reconcile, confirm, record an undo) are disabled and the region says who did what.
  function disableStaleOperationActions() {
    const live = document.getElementById("operation-live");
    const opened = document.getElementById("operation-opened");
    if (!live || !opened) return;
    if (live.getAttribute("data-state") === opened.getAttribute("data-state")) return;
    const notice = document.getElementById("operation-changed");
    if (notice) notice.hidden = false;
    document.querySelectorAll("form[data-acts-on-state] button[type='submit']").forEach(
      function (b) { b.disabled = true; }
    );
  }
  document.addEventListener("htmx:afterSettle", disableStaleOperationActions);

  // Card layout on phones (console.css): each cell carries its column's name, copied
  // from the table's header, so a row read as a card still says what each value is.
  function labelCells(root) {
    (root || document).querySelectorAll("table.data").forEach(function (table) {
      const names = Array.from(table.querySelectorAll("thead th")).map(function (th) {
        return th.textContent.trim();
      });
      if (!names.length) return;
      table.querySelectorAll("tbody tr").forEach(function (row) {
        Array.from(row.children).forEach(function (cell, index) {
          if (cell.colSpan > 1) return; // "nothing here" rows span the table
          if (!cell.hasAttribute("data-label")) cell.setAttribute("data-label", names[index] || "");
        });
      });
    });
  }
  document.addEventListener("htmx:afterSettle", function () {
    labelCells(document);
  });
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () {
      labelCells(document);
    });
  } else {
    labelCells(document);
  }

  // Ticked boxes survive htmx swaps of the rows (the inbox polls every 5 s).
  let ticked = [];
  document.addEventListener("htmx:beforeSwap", function () {
    ticked = Array.from(document.querySelectorAll("input[data-select]:checked")).map(
      function (box) {
        return box.value;
      }
    );
  });
  document.addEventListener("htmx:afterSettle", function () {
    document.querySelectorAll("input[data-select]").forEach(function (box) {
      if (ticked.indexOf(box.value) !== -1) box.checked = true;
    });
  });

  // The operation page's answer form: h / n / u choose "it happened", "it did not
  // happen", "still unknown" (input[data-answer-key]) and focus the field that answer
  // needs (data-answer-focus), so support types the evidence next.
  function chooseAnswer(key) {
    const radio = Array.from(
      document.querySelectorAll("input[type='radio'][data-answer-key='" + key + "']")
    ).find(function (box) {
      return !box.disabled && box.offsetParent !== null;
    });
    if (!radio) return false;
    radio.checked = true;
    radio.dispatchEvent(new Event("change", { bubbles: true }));
    const field = document.getElementById(radio.getAttribute("data-answer-focus"));
    (field || radio).focus();
    return true;
  }

  function onDecideKey(key) {
    // The approval page's form, else the inbox's bulk bar while something is ticked.
    const target =
      document.querySelector("form[data-decide] [data-shortcut='" + key + "']") ||
      document.querySelector("form[data-bulk]:not([hidden]) [data-shortcut='" + key + "']");
    if (!target || target.disabled) return false;
    target.focus();
    const hint = document.getElementById("decide-hint");
    if (hint) {
      hint.textContent =
        key === "a" ? "Press Enter to approve." : "Write why, then press Reject.";
    }
    return true;
  }

  document.addEventListener("keydown", function (event) {
    if (event.defaultPrevented || event.ctrlKey || event.altKey || event.metaKey) return;
    if (isTyping(event.target)) return;
    let handled = false;
    if (event.key === "/") handled = focusSearch();
    else if (event.key === "a" || event.key === "r") handled = onDecideKey(event.key);
    else if (event.key === "x") handled = toggleSelected();
    else if (event.key === "h" || event.key === "n" || event.key === "u") {
      handled = chooseAnswer(event.key);
    }
    else if (event.key === "j" || event.key === "k" || event.key === "Enter") {
      handled = onKeynavKey(event);
    }
    if (handled) event.preventDefault();
  });

  // Keep the current row across htmx swaps of the table (polling replaces it).
  let focusWasInTable = false;
  document.addEventListener("htmx:beforeSwap", function () {
    const table = keynavTable();
    focusWasInTable = Boolean(table && table.contains(document.activeElement));
  });
  document.addEventListener("htmx:afterSettle", function () {
    const table = keynavTable();
    if (!table || currentKey === null) return;
    const row = rowsOf(table).find(function (candidate) {
      return rowKey(candidate) === currentKey;
    });
    if (!row) {
      markCurrent(table, null);
      return;
    }
    if (!row.classList.contains(CURRENT)) markCurrent(table, row);
    const lostFocus = !document.activeElement || document.activeElement === document.body;
    if (focusWasInTable && lostFocus) {
      const target = firstLink(row) || row;
      if (target === row && !row.hasAttribute("tabindex")) row.tabIndex = -1;
      target.focus({ preventScroll: true });
    }
  });

  // ---------------------------------------------------------------- 2. polling

  function isPolling(elt) {
    const trigger = elt.getAttribute("hx-trigger") || elt.getAttribute("data-hx-trigger");
    return Boolean(trigger) && /(^|[\s,])every\s/.test(trigger);
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    if (!document.hidden) return;
    const detail = event.detail || {};
    const elt = detail.elt;
    const config = detail.requestConfig || {};
    // A poll tick calls htmx's handler without an event; user actions and named events
    // (refresh, submit, click...) carry one and always go through.
    if (elt instanceof Element && !config.triggeringEvent && isPolling(elt)) {
      event.preventDefault();
    }
  });

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) return;
    renderTimes(document);
    if (!window.htmx) return;
    for (const elt of document.querySelectorAll("[hx-trigger], [data-hx-trigger]")) {
      if (isPolling(elt)) window.htmx.trigger(elt, "refresh");
    }
  });

  // ---------------------------------------------------------------- 3. times

  const MINUTE = 60;
  const HOUR = 60 * MINUTE;
  const DAY = 24 * HOUR;

  function relativeText(date, now) {
    const delta = Math.round((date.getTime() - now) / 1000); // > 0: in the future
    const span = Math.abs(delta);
    let amount;
    if (span < MINUTE) {
      return delta >= 0 ? "in under a minute" : "under a minute ago";
    } else if (span < HOUR) {
      amount = Math.floor(span / MINUTE) + " min";
    } else if (span < DAY) {
      const hours = Math.floor(span / HOUR);
      const minutes = Math.floor((span % HOUR) / MINUTE);
      amount = hours + " h" + (hours < 6 && minutes > 0 ? " " + minutes + " min" : "");
    } else if (span < 30 * DAY) {
      amount = Math.floor(span / DAY) + " d";
    } else {
      return null; // far away: the absolute date says more
    }
    return delta >= 0 ? "in " + amount : amount + " ago";
  }

  function renderTimes(root) {
    const now = Date.now();
    const nodes = [];
    if (root instanceof Element && root.matches("time[data-relative]")) nodes.push(root);
    if (root.querySelectorAll) nodes.push(...root.querySelectorAll("time[data-relative]"));
    for (const node of nodes) {
      const date = new Date(node.getAttribute("datetime"));
      if (Number.isNaN(date.getTime())) continue;
      if (!node.dataset.absolute) node.dataset.absolute = node.textContent.trim();
      if (!node.title) node.title = node.dataset.absolute;
      const text = relativeText(date, now);
      node.textContent = text === null ? node.dataset.absolute : text;
      node.toggleAttribute("data-past", date.getTime() < now);
    }
  }

  document.addEventListener("htmx:load", function (event) {
    const elt = event.detail && event.detail.elt;
    if (elt) renderTimes(elt);
  });

  function start() {
    renderTimes(document);
    window.setInterval(function () {
      if (!document.hidden) renderTimes(document);
    }, 30 * 1000);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

// ------------------------------------------------------------------ 4. bulk bar, menu
(function () {
  "use strict";
  document.documentElement.classList.add("js");

  function updateBulk() {
    const form = document.querySelector("form[data-bulk]");
    if (!form) return;
    const ticked = document.querySelectorAll("input[data-select][form='" + form.id + "']:checked").length;
    form.hidden = ticked === 0;
    const count = form.querySelector("[data-bulk-count]");
    if (count) count.textContent = ticked === 0 ? "" : ticked + " selected";
  }
  document.addEventListener("change", function (event) {
    if (event.target instanceof Element && event.target.matches("input[data-select]")) updateBulk();
  });
  // Polling replaces the rows (their ticks are restored in section 1).
  document.addEventListener("htmx:afterSettle", updateBulk);

  function toggleMenu(button) {
    const menu = document.getElementById(button.getAttribute("aria-controls"));
    if (!menu) return;
    const open = button.getAttribute("aria-expanded") !== "true";
    button.setAttribute("aria-expanded", open ? "true" : "false");
    menu.classList.toggle("is-open", open);
  }
  document.addEventListener("click", function (event) {
    const button = event.target instanceof Element && event.target.closest("[data-menu-toggle]");
    if (button) toggleMenu(button);
  });

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", updateBulk);
  else updateBulk();
})();
