// Parts of a page that cost more than the page itself (an evaluation's
// analysis reads every sample) are served on their own: an element with
// data-fragment="/path" is replaced, after first paint, by what the path
// answers when asked with X-Dashboard-Fragment. Same origin only, with the
// page's credentials; DOMParser and node insertion never run scripts, so the
// fetched part stays inert. Without scripts, the element's link opens the
// part as a page. live.js says "dashboard:swapped" after it swaps a page in,
// whose parts are then loaded again (they may have moved too): each is asked
// with the version it was last answered with (X-Dashboard-Version), and a 204
// (the same version: a new status, say, but no new sample) puts back the part
// already shown, nothing rendered again.
(function () {
  "use strict";

  // By path: the version of the part last loaded from it, and the part.
  var shown = {};

  function load(slot) {
    var path = slot.getAttribute("data-fragment") || "";
    slot.removeAttribute("data-fragment"); // asked once per slot
    if (path.charAt(0) !== "/" || path.charAt(1) === "/") return; // this origin only
    var held = shown[path];
    var headers = { "X-Dashboard-Fragment": "1" };
    if (held) headers["X-Dashboard-Version"] = held.version;
    fetch(path, { cache: "no-store", credentials: "same-origin", headers: headers })
      .then(function (response) {
        if (response.status === 204 && held) return { part: held.part.cloneNode(true) };
        if (response.status !== 200) return null;
        var version = response.headers.get("X-Dashboard-Version");
        return response.text().then(function (text) {
          var part = new DOMParser().parseFromString(text, "text/html").body.firstElementChild;
          return part && { part: document.adoptNode(part), version: version };
        });
      })
      .then(function (found) {
        if (!found || !slot.parentNode) return; // the link stays: it still works
        if (found.version) {
          shown[path] = { version: found.version, part: found.part.cloneNode(true) };
        }
        slot.replaceWith(found.part);
      })
      .catch(function () { /* the server is restarting or gone: the link stays */ });
  }

  function loadAll() {
    Array.prototype.forEach.call(document.querySelectorAll("[data-fragment]"), load);
  }

  document.addEventListener("dashboard:swapped", loadAll);
  loadAll();
})();
