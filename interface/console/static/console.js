/* turnlog console.
 *
 * The pages are shells; the data comes as server-rendered HTML fragments,
 * fetched with the API token (kept in this tab's sessionStorage, sent as an
 * Authorization header, never put in a URL). A session's timeline follows
 * /v1/sessions/{id}/events as server-sent events read through fetch, since
 * EventSource cannot send headers. No framework, no build step.
 */
"use strict";

(() => {
  const TOKEN = "turnlog.token";
  const ACTOR = "turnlog.actor";
  const NAMESPACE = "turnlog.namespace";
  const store = window.sessionStorage;
  const $ = (selector, root = document) => root.querySelector(selector);
  const $$ = (selector, root = document) => Array.from(root.querySelectorAll(selector));
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  /** Raised after a 401: the token form is showing; the page resumes once one is entered. */
  class NeedsToken extends Error {}

  // ------------------------------------------------------------------ requests

  function withToken(headers = {}) {
    const token = store.getItem(TOKEN);
    const namespace = store.getItem(NAMESPACE);
    const scoped = namespace ? { ...headers, "X-Turnlog-Namespace": namespace } : headers;
    return token ? { ...scoped, Authorization: `Bearer ${token}` } : scoped;
  }

  async function request(url, init = {}) {
    const response = await fetch(url, {
      ...init,
      headers: withToken(init.headers),
      cache: "no-store",
      credentials: "omit",
    });
    if (response.status === 401) {
      const hadToken = store.getItem(TOKEN) !== null;
      store.removeItem(TOKEN);
      askForToken(hadToken ? "The server refused that token. Enter the current API token." : "");
      throw new NeedsToken("token needed");
    }
    return response;
  }

  async function problemDetail(response) {
    try {
      const problem = await response.json();
      return problem.detail || problem.title || `HTTP ${response.status}`;
    } catch {
      return `The server answered HTTP ${response.status}.`;
    }
  }

  function announce(text) {
    const region = $("#announce");
    region.textContent = "";
    setTimeout(() => { region.textContent = text; }, 50);
  }

  // --------------------------------------------------------------------- token

  let resume = () => {};

  function askForToken(message) {
    $("#main").hidden = true;
    $("#auth").hidden = false;
    const error = $("#auth-error");
    error.textContent = message;
    error.hidden = !message;
    $("#forget-token").hidden = true;
    $("#auth-token").focus();
  }

  function setUpToken(start) {
    resume = start;
    $("#auth-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const input = $("#auth-token");
      store.setItem(TOKEN, input.value.trim());
      input.value = "";
      $("#auth").hidden = true;
      $("#main").hidden = false;
      $("#forget-token").hidden = false;
      showNamespace();
      resume();
    });
    $("#forget-token").addEventListener("click", () => {
      store.removeItem(TOKEN);
      store.removeItem(NAMESPACE);
      window.location.reload();
    });
    $("#forget-token").hidden = store.getItem(TOKEN) === null;
    showNamespace();
  }

  /** The namespace the token reaches; an admin's token gets a picker of every one served. */
  async function showNamespace() {
    const place = $("#namespace");
    let who;
    try {
      const response = await fetch("/v1/whoami", { headers: withToken(), credentials: "omit" });
      if (!response.ok) return;
      who = await response.json();
    } catch {
      return;
    }
    if (who.namespaces.length < 2) {
      place.textContent = who.namespace;
      place.hidden = false;
      return;
    }
    const picker = document.createElement("select");
    picker.id = "namespace-picker";
    picker.setAttribute("aria-label", "Namespace");
    for (const name of who.namespaces) {
      const option = new Option(name, name, false, name === who.namespace);
      picker.append(option);
    }
    picker.addEventListener("change", () => {
      store.setItem(NAMESPACE, picker.value);
      window.location.assign("/console");
    });
    place.replaceChildren(picker);
    place.hidden = false;
  }

  // ----------------------------------------------------------------- fragments

  /** Fetch a fragment into ``container``; the fragment's root element, or null. */
  async function load(container, url) {
    container.setAttribute("aria-busy", "true");
    try {
      const response = await request(url, { headers: { Accept: "text/html" } });
      if (!response.ok) {
        showProblem(container, await problemDetail(response));
        return null;
      }
      swap(container, await response.text());
      return container.firstElementChild;
    } catch (error) {
      if (!(error instanceof NeedsToken)) {
        showProblem(container, `Cannot reach the server (${error.message}).`);
      }
      return null;
    } finally {
      container.removeAttribute("aria-busy");
    }
  }

  function showProblem(container, text) {
    // Keep what is shown; say above it what went wrong.
    let banner = $(":scope > .problem.banner", container);
    if (!$(":scope > .fragment", container)) container.replaceChildren();
    if (!banner) {
      banner = document.createElement("p");
      banner.className = "problem banner";
      banner.setAttribute("role", "alert");
      container.prepend(banner);
    }
    banner.textContent = text;
  }

  /** Replace a fragment, keeping open panels, typed text and focus. */
  function swap(container, html) {
    const open = new Set($$("details[data-key]", container).filter((d) => d.open).map((d) => d.dataset.key));
    const typed = new Map();
    for (const field of $$("input[id], textarea[id]", container)) {
      if (field.type === "radio" || field.type === "checkbox") {
        if (field.checked) typed.set(field.id, true);
      } else if (field.value) {
        typed.set(field.id, field.value);
      }
    }
    const focused = container.contains(document.activeElement) ? document.activeElement.id : "";
    container.innerHTML = html;
    for (const details of $$("details[data-key]", container)) {
      if (open.has(details.dataset.key)) details.open = true;
    }
    for (const [id, value] of typed) {
      const field = document.getElementById(id);
      if (!field || !container.contains(field)) continue;
      if (value === true) field.checked = true;
      else field.value = value;
    }
    if (focused) document.getElementById(focused)?.focus();
  }

  // ------------------------------------------------------------ sessions page

  function sessionsPage() {
    const container = $("#data");
    const show = $("#show");
    const search = $("#q");
    const params = new URLSearchParams(window.location.search);
    show.value = params.get("show") || "";
    search.value = params.get("q") || "";
    const limit = params.get("limit"); // page size, for a bookmark (and the tests)
    let cursors = [""]; // the cursor of every page visited, for "Previous"

    async function refresh(tell = true) {
      const query = new URLSearchParams();
      if (show.value) query.set("show", show.value);
      if (search.value.trim()) query.set("q", search.value.trim());
      if (limit) query.set("limit", limit);
      const cursor = cursors[cursors.length - 1];
      if (cursor) query.set("cursor", cursor);
      const fragment = await load(container, `${container.dataset.src}?${query}`);
      const following = fragment ? fragment.dataset.nextCursor : "";
      $("#next-page").disabled = !following;
      $("#next-page").dataset.cursor = following || "";
      $("#prev-page").disabled = cursors.length < 2;
      $("#first-page").disabled = cursors.length < 2;
      $("#page-number").textContent = `Page ${cursors.length}`;
      if (fragment && tell) announce(`Page ${cursors.length}: ${fragment.dataset.rows} sessions shown.`);
    }

    $("#filter").addEventListener("submit", (event) => {
      event.preventDefault();
      cursors = [""];
      const url = new URL(window.location.href);
      if (show.value) url.searchParams.set("show", show.value);
      else url.searchParams.delete("show");
      if (search.value.trim()) url.searchParams.set("q", search.value.trim());
      else url.searchParams.delete("q");
      window.history.replaceState(null, "", url);
      refresh();
    });
    $("#refresh").addEventListener("click", () => refresh());
    $("#next-page").addEventListener("click", (event) => {
      cursors.push(event.currentTarget.dataset.cursor);
      refresh();
    });
    $("#prev-page").addEventListener("click", () => {
      cursors.pop();
      refresh();
    });
    $("#first-page").addEventListener("click", () => {
      cursors = [""];
      refresh();
    });
    // Statuses change under an operator's eyes: redraw now and then, unless they are
    // working in the list (focus inside it) or the tab is hidden.
    setInterval(() => {
      const busy = container.contains(document.activeElement) || !$("#auth").hidden;
      if (!busy && document.visibilityState === "visible") refresh(false);
    }, 10000);
    setUpToken(() => refresh());
    refresh();
  }

  // ------------------------------------------------------------- session page

  function sessionPage() {
    const container = $("#data");
    const sessionId = container.dataset.sessionId;
    const FORKABLE = new Set([
      "SessionStarted", "SessionForked", "TurnCompleted", "TurnFailed", "TurnCancelled", "TurnAbandoned",
    ]);
    const limit = new URLSearchParams(window.location.search).get("limit"); // page size
    // Events by version: those the live stream delivered, and the ranges read for raw panels.
    // The page never reads the whole session: the timeline shows one page of the latest
    // turns, earlier pages come on request, and the live stream starts at the shown version.
    const known = new Map();
    let lastSeen = 0; // the last version the live stream delivered
    let shown = 0; // the session version the rendered timeline reflects
    let low = 0; // the number of the first turn the live part shows; kept as turns arrive
    let earlier = null; // the list of earlier turns loaded on request, kept across redraws
    let earlierCursor = ""; // where the page before them starts ("": none left)
    let following = false;
    let pending = null;
    let running = null;
    let again = false;

    function timelineUrl() {
      const query = new URLSearchParams();
      if (low) query.set("since", String(low));
      else if (limit) query.set("limit", limit);
      return `${container.dataset.src}?${query}`;
    }

    async function refresh() {
      if (running) {
        again = true;
        return running;
      }
      running = (async () => {
        do {
          again = false;
          const list = earlier; // detached by the redraw; put back below
          const focused = list && list.contains(document.activeElement) ? document.activeElement : null;
          const fragment = await load(container, timelineUrl());
          if (fragment) {
            shown = Number(fragment.dataset.version);
            container.dataset.status = fragment.dataset.status;
            const first = Number(fragment.dataset.low);
            if (low && first > low) earlier = null; // more new turns than one redraw holds
            else earlier = list;
            if (!low || first > low) low = first;
            placeEarlier(fragment);
            if (focused && earlier) focused.focus();
            fillRawPanels();
            drawReplying();
          }
        } while (again);
      })();
      try {
        await running;
      } finally {
        running = null;
      }
    }

    function refreshSoon() {
      clearTimeout(pending);
      pending = setTimeout(refresh, 100);
    }

    // Earlier turns: "Load earlier turns" fetches the page before the oldest shown, by the
    // cursor of GET /v1/sessions/{id}/turns. Finished turns never change, so the pages
    // loaded stay as they are while the live part is redrawn.
    function placeEarlier(fragment) {
      const slot = $("ol.earlier-turns", fragment);
      if (!slot) return;
      if (earlier) slot.replaceWith(earlier);
      const cursor = earlier ? earlierCursor : fragment.dataset.nextCursor || "";
      const button = $("button.load-earlier", fragment);
      button.dataset.cursor = cursor;
      button.hidden = !cursor;
      $(".earlier", fragment).hidden = !cursor && !earlier;
      countShown();
    }

    function countShown() {
      const total = $(".earlier-count", container);
      if (!total) return;
      const all = $$("ol.turns > li", container).length;
      total.textContent = `Showing the latest ${all} of ${total.dataset.total} turns.`;
    }

    async function loadEarlier(button) {
      const query = new URLSearchParams({ cursor: button.dataset.cursor });
      if (limit) query.set("limit", limit);
      button.disabled = true;
      try {
        const response = await request(`/console/fragments/sessions/${sessionId}/turns?${query}`, {
          headers: { Accept: "text/html" },
        });
        if (!response.ok) {
          announce(await problemDetail(response));
          return;
        }
        const holder = document.createElement("template");
        holder.innerHTML = await response.text();
        const page = holder.content.firstElementChild;
        const items = $$("ol.turns > li", page);
        const list = earlier || $("ol.earlier-turns", container);
        list.prepend(...items);
        earlier = list;
        earlierCursor = page.dataset.nextCursor || "";
        button.dataset.cursor = earlierCursor;
        button.hidden = !earlierCursor;
        countShown();
        const numbers = items.map((item) => item.dataset.number);
        if (numbers.length) announce(`Turns ${numbers[0]} to ${numbers[numbers.length - 1]} loaded.`);
        if (button.hidden && items.length) $("h2", items[items.length - 1]).focus();
        for (const details of $$("details[data-raw-for]", list)) drawPanel(details);
      } catch (error) {
        if (!(error instanceof NeedsToken)) announce(`Cannot reach the server (${error.message}).`);
      } finally {
        button.disabled = false;
      }
    }

    // Raw events: a panel reads its turn's version range when opened (one range of
    // /v1/sessions/{id}/events), then the live stream adds to it.
    const turnOf = (event) => (event.payload && event.payload.turn_id) || "";

    function fillRawPanels() {
      for (const details of $$("details[data-raw-for]", container)) drawPanel(details);
    }

    /** Read versions first..last (last 0: up to the head) into ``known``, where missing. */
    async function readRange(first, last) {
      let after = first - 1;
      while (known.has(after + 1) && (!last || after < last)) after += 1;
      // Up to the head: the live stream delivers everything after what it last gave.
      if (!last && after >= lastSeen) return;
      while (!last || after < last) {
        const size = last ? Math.min(1000, last - after) : 1000;
        const response = await request(`/v1/sessions/${sessionId}/events?after=${after}&limit=${size}`, {
          headers: { Accept: "application/json" },
        });
        if (!response.ok) throw new Error(await problemDetail(response));
        const page = await response.json();
        for (const event of page.events) known.set(event.version, event);
        if (page.events.length < size) return;
        after = page.next_after;
      }
    }

    async function eventsOf(details) {
      const turnId = details.dataset.rawFor;
      if (turnId) {
        await readRange(Number(details.dataset.first) || 1, Number(details.dataset.last) || 0);
      } else {
        // The session's own events: its start, and its close (the last event) if closed.
        await readRange(1, 1);
        if (container.dataset.status === "closed") await readRange(shown, shown);
      }
      return Array.from(known.values())
        .filter((event) => turnOf(event) === turnId)
        .sort((a, b) => a.version - b.version);
    }

    async function drawPanel(details) {
      const body = $(".raw-body", details);
      if (!details.open) {
        body.replaceChildren();
        return;
      }
      let mine;
      try {
        mine = await eventsOf(details);
      } catch (error) {
        if (!(error instanceof NeedsToken)) body.textContent = `Cannot read the events (${error.message}).`;
        return;
      }
      if (!details.open) return;
      $(".count", details).textContent = `(${mine.length})`;
      const table = document.createElement("table");
      table.className = "grid raw-events";
      table.innerHTML =
        "<thead><tr><th scope='col' class='num'>Position</th><th scope='col' class='num'>Version</th>" +
        "<th scope='col'>Type</th><th scope='col'>Time</th><th scope='col'>Payload</th>" +
        "<th scope='col'><span class='visually-hidden'>Fork</span></th></tr></thead><tbody></tbody>";
      $("tbody", table).append(...mine.map(rawRow));
      body.replaceChildren(table);
    }

    function rawRow(event) {
      const row = document.createElement("tr");
      row.dataset.type = event.type;
      const cells = [
        ["num", String(event.position)],
        ["num", String(event.version)],
        ["type", event.type],
        ["time", new Date(event.timestamp).toISOString().replace("T", " ").slice(0, 23) + " UTC"],
      ];
      for (const [css, text] of cells) {
        const cell = document.createElement("td");
        cell.className = css;
        cell.textContent = text;
        row.append(cell);
      }
      const payload = document.createElement("pre");
      payload.className = "json";
      payload.textContent = JSON.stringify(event.payload, null, 2);
      const cell = document.createElement("td");
      cell.append(payload);
      row.append(cell);
      const action = document.createElement("td");
      if (FORKABLE.has(event.type)) {
        // Between turns (the session's start, or a turn's last event): a fork may start here.
        const button = document.createElement("button");
        button.type = "button";
        button.className = "fork-here";
        button.dataset.version = String(event.version);
        button.textContent = "Fork here";
        button.title = `Start a new session from version ${event.version}`;
        action.append(button);
      }
      row.append(action);
      return row;
    }

    async function forkAt(button) {
      const version = Number(button.dataset.version);
      button.disabled = true;
      try {
        const response = await request(`/v1/sessions/${sessionId}/fork`, {
          method: "POST",
          headers: { "Content-Type": "application/json", Accept: "application/json" },
          body: JSON.stringify({ version, created_by: "console" }),
        });
        if (!response.ok) {
          const why = await problemDetail(response);
          announce(`Cannot fork at version ${version}: ${why}`);
          button.title = why;
          return;
        }
        const fork = await response.json();
        announce(`Forked at version ${version}; opening the new session.`);
        window.location.assign(`/console/sessions/${fork.session_id}`);
      } catch (failure) {
        if (!(failure instanceof NeedsToken)) announce(`Cannot reach the server (${failure.message}).`);
      } finally {
        button.disabled = false;
      }
    }

    // A reply while it streams: live pieces (delta frames, never stored) shown in a
    // "replying…" section of its turn, dropped once the stored reply arrives.
    let replying = null; // {turn_id, step, text}

    function delta(piece) {
      const same = replying && replying.turn_id === piece.turn_id && replying.step === piece.step;
      if (!same || piece.offset === 0) {
        replying = { turn_id: piece.turn_id, step: piece.step, text: "" };
      }
      // A piece after a gap (a slow reader's dropped pieces): show a mark, the stored reply follows.
      if (piece.offset > replying.text.length) replying.text += " … ";
      replying.text += piece.text;
      drawReplying();
    }

    function drawReplying() {
      const old = $(".msg.replying", container);
      const turn = replying && document.getElementById(`turn-${replying.turn_id}`);
      if (!turn) {
        if (old) old.remove();
        return;
      }
      let section = old;
      if (!section || !turn.contains(section)) {
        if (section) section.remove();
        section = document.createElement("section");
        section.className = "msg replying";
        section.setAttribute("aria-label", "Reply arriving");
        section.setAttribute("aria-live", "off");
        section.innerHTML = "<h3></h3><p class='text'></p>";
        const before = $(".waiting", turn) || $("details.raw", turn);
        before.parentNode.insertBefore(section, before);
      }
      $("h3", section).textContent = `Model · step ${replying.step} · replying…`;
      $(".text", section).textContent = replying.text;
    }

    function received(event) {
      if (event.version <= lastSeen) return;
      const replaced =
        (event.type === "ModelReplied" && event.payload.step >= replying?.step) ||
        ["TurnCompleted", "TurnFailed", "TurnInterrupted", "TurnAbandoned"].includes(event.type);
      if (replying && turnOf(event) === replying.turn_id && replaced) {
        replying = null; // the stored reply (or the turn's end) replaces the preview
        drawReplying();
      }
      lastSeen = event.version;
      known.set(event.version, event);
      const panel = $$("details[data-raw-for]", container).find((d) => d.dataset.rawFor === turnOf(event));
      if (panel && panel.open) drawPanel(panel);
      else if (panel && panel.dataset.first) {
        $(".count", panel).textContent = `(${event.version - Number(panel.dataset.first) + 1})`;
      }
      if (event.version > shown || !panel) refreshSoon();
    }

    function setLive(state, text) {
      const live = $("#live");
      live.dataset.state = state;
      $(".icon", live).textContent = { live: "●", reconnecting: "◌", ended: "■" }[state] || "◌";
      $(".text", live).textContent = text;
    }

    function parseFrame(frame) {
      const data = frame
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""));
      return data.length ? JSON.parse(data.join("\n")) : null;
    }

    async function follow() {
      following = true;
      let wait = 1000;
      try {
        for (;;) {
          const after = lastSeen;
          try {
            const response = await request(`/v1/sessions/${sessionId}/events?after=${after}`, {
              headers: { Accept: "text/event-stream" },
            });
            if (response.status === 404) {
              setLive("ended", "No such session.");
              return;
            }
            if (!response.ok) throw new Error(await problemDetail(response));
            setLive("live", "Live: new events appear as they are stored.");
            wait = 1000;
            const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
            let buffer = "";
            for (;;) {
              const { value, done } = await reader.read();
              if (done) break;
              buffer += value;
              let end;
              while ((end = buffer.indexOf("\n\n")) >= 0) {
                const frame = buffer.slice(0, end);
                const data = parseFrame(frame);
                buffer = buffer.slice(end + 2);
                if (data && /^event: delta$/m.test(frame)) delta(data);
                else if (data) received(data);
              }
            }
          } catch (error) {
            if (error instanceof NeedsToken) return;
          }
          setLive("reconnecting", "The live event stream was cut; reconnecting…");
          await sleep(wait);
          wait = Math.min(wait * 2, 15000);
        }
      } finally {
        following = false;
      }
    }

    // The operator's decisions on an interrupted turn.
    function checkJson(field) {
      let message = "";
      if (field.value.trim() === "") {
        message = 'Enter the result as JSON, for example {"written": true}, or null.';
      } else {
        try {
          JSON.parse(field.value);
        } catch (error) {
          message = `This is not valid JSON: ${error.message}`;
        }
      }
      field.setCustomValidity(message);
      field.setAttribute("aria-invalid", message ? "true" : "false");
      const error = document.getElementById(field.getAttribute("aria-describedby"));
      error.textContent = message;
      error.hidden = !message;
      return !message;
    }

    function confirmDecision(title, summary, label, warning) {
      const dialog = $("#confirm");
      const actor = $("#confirm-actor");
      const box = $("#confirm-warning");
      if (!box.dataset.html) box.dataset.html = box.innerHTML;
      if (warning) {
        const line = document.createElement("p");
        line.textContent = warning;
        box.replaceChildren(line);
      } else {
        box.innerHTML = box.dataset.html; // the page's own text, never data
      }
      $("#confirm-title").textContent = title;
      $("#confirm-summary").textContent = summary;
      $("#confirm-go").textContent = label;
      actor.value = store.getItem(ACTOR) || "";
      dialog.returnValue = "";
      dialog.showModal();
      actor.focus();
      return new Promise((resolve) => {
        dialog.addEventListener(
          "close",
          () => {
            if (dialog.returnValue !== "confirm") return resolve(null);
            const name = actor.value.trim();
            store.setItem(ACTOR, name);
            resolve(name);
          },
          { once: true },
        );
      });
    }

    function decision(form) {
      const call = form.dataset.callId;
      if (form.dataset.action === "approve") {
        const field = form.elements.arguments;
        const edited = JSON.stringify(JSON.parse(field.value)) !== field.dataset.original;
        const note = form.elements.note.value.trim();
        return {
          title: `Approve ${form.dataset.tool}?`,
          summary:
            `Call ${call} starts as soon as a worker takes the turn` +
            (edited ? ", with the arguments as you edited them (checked against the tool's schema)." : ".") +
            (note ? ` Note: “${note}”.` : ""),
          warning: "Approving lets the tool act outside turnlog; your name is recorded with the approval.",
          label: "Approve the call",
          url: `/v1/sessions/${sessionId}/tool-calls/${call}/approve`,
          body: { note, ...(edited ? { arguments: JSON.parse(field.value) } : {}) },
          done: "Call approved; the turn continues.",
        };
      }
      if (form.dataset.action === "reject") {
        const reason = form.elements.reason.value.trim();
        return {
          title: `Reject ${form.dataset.tool}?`,
          summary: `Call ${call} never runs; the model is told “rejected by operator: ${reason}” and the turn continues.`,
          warning: "Your name and reason are recorded in the session's log.",
          label: "Reject the call",
          url: `/v1/sessions/${sessionId}/tool-calls/${call}/reject`,
          body: { reason },
          done: "Call rejected; the turn continues.",
        };
      }
      if (form.dataset.action === "cancel") {
        const reason = form.elements.reason.value.trim();
        const force = Boolean(form.elements.force?.checked);
        return {
          title: force ? "Force-cancel this turn?" : "Cancel this turn?",
          summary: `Reason: “${reason}”.`,
          warning: force
            ? "Force kills a side-effecting tool that is running: its outcome becomes unknown, the turn is interrupted and the session blocked until an operator records what happened."
            : "A side-effecting tool that is running is left to finish and its result recorded; then the turn stops.",
          label: force ? "Force-cancel the turn" : "Cancel the turn",
          url: `/v1/sessions/${sessionId}/turns/${form.dataset.turnId}/cancel`,
          body: { reason, force },
          done: "Cancel recorded.",
        };
      }
      if (form.dataset.action === "abandon") {
        const reason = form.elements.reason.value.trim();
        return {
          title: "Abandon this turn?",
          summary:
            `The turn ends without a reply; its tool calls of unknown outcome stay unknown, ` +
            `and the session takes new turns again. Reason: “${reason}”.`,
          label: "Abandon the turn",
          url: `/v1/sessions/${sessionId}/turns/${form.dataset.turnId}/abandon`,
          body: { reason },
          done: "Turn abandoned. The session takes new turns again.",
        };
      }
      const outcome = form.elements.outcome.value;
      const result = JSON.parse(form.elements.result.value);
      const text = JSON.stringify(result);
      return {
        title: `Record that ${form.dataset.tool} ${outcome}?`,
        summary:
          `turnlog will record that call ${form.dataset.callId} ${outcome}, with the result ` +
          `${text.length > 200 ? text.slice(0, 199) + "…" : text}. Once every unknown call of ` +
          `the turn has an outcome, the turn continues and the model is given this result.`,
        label: "Record the outcome",
        url: `/v1/sessions/${sessionId}/tool-calls/${form.dataset.callId}/resolve`,
        body: { outcome, result, note: form.elements.note.value.trim() },
        done: "Outcome recorded; the turn continues once every call has one.",
      };
    }

    async function decide(form) {
      if (form.dataset.action === "resolve" && !checkJson(form.elements.result)) {
        form.elements.result.reportValidity();
        return;
      }
      if (form.dataset.action === "approve" && !checkJson(form.elements.arguments)) {
        form.elements.arguments.reportValidity();
        return;
      }
      const what = decision(form);
      const actor = await confirmDecision(what.title, what.summary, what.label, what.warning);
      if (actor === null) return;
      const error = $(".form-error", form);
      const button = $("button[type=submit]", form);
      error.hidden = true;
      button.disabled = true;
      try {
        const response = await request(what.url, {
          method: "POST",
          headers: { "Content-Type": "application/json", Accept: "application/json" },
          body: JSON.stringify({ ...what.body, actor }),
        });
        if (!response.ok) {
          error.textContent = await problemDetail(response);
          error.hidden = false;
          return;
        }
        const turn = await response.json();
        announce(what.done);
        await refresh();
        document.getElementById(`turn-h-${turn.turn_id}`)?.focus();
      } catch (failure) {
        if (!(failure instanceof NeedsToken)) {
          error.textContent = `Cannot reach the server (${failure.message}).`;
          error.hidden = false;
        }
      } finally {
        button.disabled = false;
      }
    }

    container.addEventListener("click", (event) => {
      const button = event.target.closest("button.load-earlier");
      if (button) loadEarlier(button);
      const fork = event.target.closest("button.fork-here");
      if (fork) forkAt(fork);
    });
    // Cancel is not a submit button, so that Enter in the name field confirms.
    $("#confirm-cancel").addEventListener("click", () => $("#confirm").close("cancel"));
    container.addEventListener("input", (event) => {
      if (event.target.name === "result" || event.target.name === "arguments") checkJson(event.target);
    });
    container.addEventListener("submit", (event) => {
      const form = event.target.closest("form[data-action]");
      if (!form) return;
      event.preventDefault();
      decide(form);
    });
    // "toggle" does not bubble: listen in the capture phase to draw a panel when it opens.
    container.addEventListener(
      "toggle",
      (event) => {
        if (event.target.matches("details[data-raw-for]")) drawPanel(event.target);
      },
      true,
    );

    async function start() {
      await refresh();
      // Live from the version shown: the stream never replays the session's past.
      if (!lastSeen) lastSeen = shown;
      if (!following && shown) follow();
    }
    // Relative times and running durations age; a busy session is redrawn now and then.
    setInterval(() => {
      if (container.dataset.status === "busy" && document.visibilityState === "visible") refresh();
    }, 10000);
    setUpToken(start);
    start();
  }

  // ------------------------------------------------------------ overview page

  function overviewPage() {
    const container = $("#data");
    async function refresh() {
      const fragment = await load(container, container.dataset.src);
      if (fragment) $("#updated").textContent = `Updated ${new Date().toLocaleTimeString()}; refreshes every 5 s.`;
    }
    setInterval(() => {
      if (document.visibilityState === "visible" && $("#auth").hidden) refresh();
    }, Number(container.dataset.refresh));
    setUpToken(refresh);
    refresh();
  }

  const pages = { sessions: sessionsPage, session: sessionPage, overview: overviewPage };
  pages[document.body.dataset.page]?.();
})();
