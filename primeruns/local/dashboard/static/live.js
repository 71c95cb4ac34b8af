// Live pages: while the run a page shows may still change (data-live="true"),
// ask the same page again every few seconds with the version it shows; the
// server answers 204 while that is current, else the new page, whose content
// is swapped in. Same origin only; DOMParser and innerHTML never run scripts,
// so fetched content stays inert text and SVG.
(function () {
  "use strict";
  var main = document.getElementById("content");
  if (!main) return;
  var every = parseInt(main.dataset.pollMs, 10) || 2000;

  function tick() {
    if (main.dataset.live !== "true") return;
    fetch(window.location.href, {
      cache: "no-store",
      credentials: "same-origin",
      headers: { "X-Dashboard-Version": main.dataset.version || "" }
    })
      // 204: what this page shows is still current.
      .then(function (response) { return response.status === 200 ? response.text() : null; })
      .then(function (text) {
        if (text === null) return;
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("content");
        if (!fresh) return;
        if (fresh.dataset.version !== main.dataset.version) {
          main.innerHTML = fresh.innerHTML;
          main.dataset.version = fresh.dataset.version;
          // fragments.js loads the swapped-in page's parts.
          document.dispatchEvent(new Event("dashboard:swapped"));
        }
        main.dataset.live = fresh.dataset.live;
      })
      .catch(function () { /* the server is restarting or gone: try again later */ })
      .then(function () { window.setTimeout(tick, every); });
  }

  window.setTimeout(tick, every);
})();
