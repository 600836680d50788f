// The aqw dashboard's only script: reload pages marked data-refresh="SECONDS" while the
// footer's checkbox is ticked (remembered in localStorage). Everything works without it.
(function () {
  "use strict";
  var seconds = Number(document.body.getAttribute("data-refresh"));
  var box = document.getElementById("auto-refresh");
  if (!seconds || !box) return;
  var key = "aqw-auto-refresh";
  box.checked = window.localStorage.getItem(key) !== "off";
  box.addEventListener("change", function () {
    window.localStorage.setItem(key, box.checked ? "on" : "off");
  });
  window.setInterval(function () {
    if (box.checked && document.visibilityState === "visible") window.location.reload();
  }, seconds * 1000);
})();
