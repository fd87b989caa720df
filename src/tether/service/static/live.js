// The timeline follows its live runs: the service's event stream of each run (EventSource, the
// login cookie authenticates it) says when rows are mirrored; the rows themselves come from the
// server as rendered HTML (one renderer), after the last seq the page shows. A page that shows
// the newest rows also follows its session's stream, which names the runs that start after the
// page was opened (they are followed in turn) and the session's newest seq.
(function () {
  "use strict";
  const timeline = document.getElementById("timeline");
  if (!timeline) return;
  const runs = (timeline.dataset.live || "").split(" ").filter(Boolean);
  const following = timeline.dataset.follow === "yes";
  if (!runs.length && !following) return;
  const session = timeline.dataset.session;
  const seen = new Set(runs);
  let current = null;
  const state = document.getElementById("live-state");
  let fetching = null, again = false;

  function lastShown() { return parseInt(timeline.dataset.last || "0", 10); }

  async function pull() {
    if (fetching) { again = true; return fetching; }
    fetching = (async () => {
      do {
        again = false;
        const after = lastShown();
        // From the last row shown: its group brings its run's header up to date (status,
        // duration, stop reason) even when no row is new.
        const from = Math.max(0, after - 1);
        const res = await fetch("/sessions/" + encodeURIComponent(session) + "/rows.html?after=" + from,
                                { credentials: "same-origin" });
        if (!res.ok) { state.textContent = "live update failed: HTTP " + res.status; return; }
        const box = document.createElement("div");
        box.innerHTML = await res.text();
        let newest = after;
        for (const group of Array.from(box.querySelectorAll("section.group"))) {
          const rows = Array.from(group.querySelectorAll("li.row")).filter(
            (li) => parseInt(li.dataset.seq, 10) > after);
          rows.forEach((li) => { li.classList.add("new"); newest = Math.max(newest, parseInt(li.dataset.seq, 10)); });
          const last = timeline.querySelector("section.group:last-of-type");
          const head = group.querySelector(".run-head");
          // A group of withheld rows names no run: it continues the open group.
          if (last && (last.dataset.run === group.dataset.run || group.dataset.run === "")) {
            const ol = last.querySelector("ol.rows");
            rows.forEach((li) => ol.appendChild(li));
            const old = last.querySelector(".run-head");
            if (head && old) old.replaceWith(head); else if (head) last.prepend(head);
          } else if (rows.length) {
            group.querySelectorAll("li.row").forEach((li) => { if (!rows.includes(li)) li.remove(); });
            const pending = head && document.querySelector('#pending .run-head[data-run="' + head.dataset.run + '"]');
            if (pending) pending.remove();
            timeline.appendChild(group);
          }
        }
        timeline.dataset.last = String(newest);
        document.querySelectorAll('[data-role="last-shown"], [data-role="last-seq"]').forEach((el) => {
          if (parseInt(el.textContent, 10) < newest) el.textContent = String(newest);
        });
      } while (again);
    })().finally(() => { fetching = null; });
    return fetching;
  }

  async function refreshHead(run) {
    const res = await fetch("/sessions/" + encodeURIComponent(session) + "/runs/" +
                            encodeURIComponent(run) + "/head.html", { credentials: "same-origin" });
    if (!res.ok) return;
    const box = document.createElement("div");
    box.innerHTML = await res.text();
    const fresh = box.querySelector(".run-head");
    document.querySelectorAll('.run-head[data-run="' + run + '"]').forEach((el) => {
      el.replaceWith(fresh.cloneNode(true));
    });
  }

  function setStatus(run, status) {
    document.querySelectorAll('.run-head[data-run="' + run + '"] [data-role="status"]').forEach((el) => {
      el.textContent = status; el.className = "badge " + status;
    });
  }

  // What the page follows, the run's id a link to its place (as everywhere on the pages).
  function say(before, run, after) {
    const a = document.createElement("a");
    a.href = "/sessions/" + encodeURIComponent(session) + "/runs/" + encodeURIComponent(run);
    a.className = "run-link";
    a.textContent = run;
    state.replaceChildren(before, a, after);
  }

  // A run with no row on the page yet: its header in the list below the timeline.
  async function addPending(run) {
    if (document.querySelector('.run-head[data-run="' + run + '"]')) return;
    const res = await fetch("/sessions/" + encodeURIComponent(session) + "/runs/" +
                            encodeURIComponent(run) + "/head.html", { credentials: "same-origin" });
    if (!res.ok) return;
    const box = document.createElement("div");
    box.innerHTML = await res.text();
    const head = box.querySelector(".run-head");
    // Its rows may have come meanwhile, with their header.
    if (head && !document.querySelector('.run-head[data-run="' + run + '"]')) {
      document.getElementById("pending").appendChild(head);
    }
  }

  // One run at a time, in the order they run.
  function followNext() {
    if (current || !runs.length) return;
    current = runs.shift();
    const run = current;
    say("following run ", run, "…");
    const es = new EventSource("/live/runs/" + encodeURIComponent(run) + "/events");
    es.addEventListener("row", () => { pull(); });
    es.addEventListener("status", (e) => { setStatus(run, JSON.parse(e.data).status); });
    es.addEventListener("end", async (e) => {
      es.close();
      setStatus(run, JSON.parse(e.data).status);
      await pull();
      await refreshHead(run);
      say("run ", run, " ended: " + JSON.parse(e.data).status);
      current = null;
      followNext();
    });
    es.onerror = () => { if (es.readyState === EventSource.CLOSED) state.textContent = "live updates stopped"; };
  }

  if (following) {
    const ss = new EventSource("/live/sessions/" + encodeURIComponent(session) + "/events");
    ss.addEventListener("run", async (e) => {
      const run = JSON.parse(e.data).run;
      if (seen.has(run)) return;
      seen.add(run);
      await addPending(run);
      runs.push(run);
      followNext();
    });
    ss.addEventListener("seq", (e) => { if (JSON.parse(e.data).last_seq > lastShown()) pull(); });
  }
  followNext();
})();
