// Parts of a page that cost more than the page itself (an evaluation's
// analysis reads every sample) are served on their own: an element with
// data-fragment="/path" is replaced, after first paint, by what the path
// answers when asked with X-Dashboard-Fragment. Same origin only, with the
// page's credentials; DOMParser and node insertion never run scripts, so the
// fetched part stays inert. Without scripts, the element's link opens the
// part as a page. live.js says "dashboard:swapped" after it swaps a page in,
// whose parts are then loaded again (they may have moved too).
(function () {
  "use strict";

  function load(slot) {
    var path = slot.getAttribute("data-fragment") || "";
    slot.removeAttribute("data-fragment"); // asked once per slot
    if (path.charAt(0) !== "/" || path.charAt(1) === "/") return; // this origin only
    fetch(path, {
      cache: "no-store",
      credentials: "same-origin",
      headers: { "X-Dashboard-Fragment": "1" }
    })
      .then(function (response) { return response.status === 200 ? response.text() : null; })
      .then(function (text) {
        if (text === null || !slot.parentNode) return; // the link stays: it still works
        var part = new DOMParser().parseFromString(text, "text/html").body.firstElementChild;
        if (part) slot.replaceWith(document.adoptNode(part));
      })
      .catch(function () { /* the server is restarting or gone: the link stays */ });
  }

  function loadAll() {
    Array.prototype.forEach.call(document.querySelectorAll("[data-fragment]"), load);
  }

  document.addEventListener("dashboard:swapped", loadAll);
  loadAll();
})();
