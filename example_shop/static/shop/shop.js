/* Stoep: small progressive enhancements. Everything works without JavaScript. */
(function () {
  "use strict";

  /* Order page: poll the JSON status about once a second while the payment is processing, and swap in
     the new status panel when it changes (the <noscript> meta refresh covers browsers without JS). */
  var panel = document.querySelector("[data-status-url]");
  if (panel && window.fetch) {
    var url = panel.getAttribute("data-status-url");
    var started = Date.now();
    var current = "processing";
    var poll = function () {
      fetch(url, { headers: { Accept: "application/json" }, cache: "no-store", credentials: "same-origin" })
        .then(function (response) { return response.ok ? response.json() : null; })
        .catch(function () { return null; })
        .then(function (data) {
          if (data && data.status !== current) {
            current = data.status;
            panel.innerHTML = data.html;
            /* A paid order empties the cart: keep the header's count in step. */
            var count = document.querySelector("[data-cart-count]");
            var link = document.querySelector("a[data-nav='cart']");
            if (count && typeof data.cart_count === "number") {
              count.textContent = String(data.cart_count);
              if (link) {
                link.setAttribute("aria-label", "Cart, " + data.cart_count + (data.cart_count === 1 ? " item" : " items"));
              }
            }
          }
          if (data && data.final) {
            panel.removeAttribute("data-status-url");
            return;
          }
          /* Every second for two minutes, then every five seconds. */
          window.setTimeout(poll, Date.now() - started < 120000 ? 1000 : 5000);
        });
    };
    window.setTimeout(poll, 1000);
  }

  /* Checkout: the delivery address fields only when "Deliver to my billing address" is unticked. */
  var same = document.getElementById("shipping_same");
  var fields = document.querySelector("[data-shipping-fields]");
  if (same && fields) {
    var sync = function () {
      fields.hidden = same.checked;
      same.setAttribute("aria-expanded", same.checked ? "false" : "true");
    };
    same.addEventListener("change", sync);
    sync();
  }

  /* A form with errors: move focus to the summary so screen readers announce it. */
  var summary = document.querySelector("[data-error-summary]");
  if (summary) {
    summary.focus();
  }
})();
