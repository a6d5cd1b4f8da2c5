package web

import (
	"net/http"
)

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, "login", page{Title: "Log in", Data: safeNext(r.URL.Query().Get("next"))})
}

// login accepts exactly the configured operator token. The token travels in
// the POST body only, is kept in the HttpOnly session cookie and is never
// written to a page, a URL or a log line.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.PostFormValue("next"))
	if !h.auth.valid(r.PostFormValue("token")) {
		h.logger.WarnContext(r.Context(), "console: login refused")
		w.WriteHeader(http.StatusUnauthorized)
		msg := "That is not the operator token."
		if !h.auth.armed {
			msg = "Login is disabled: CONSOLE_OPERATOR_TOKEN is not set."
		}
		h.render(w, r, "login", page{Title: "Log in", Error: msg, Data: next})
		return
	}
	// A browser session cookie (no Max-Age): closing the browser logs out.
	http.SetCookie(w, h.auth.cookie(sessionCookie, r.PostFormValue("token"), 0))
	h.logger.InfoContext(r.Context(), "console: operator logged in")
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, h.auth.cookie(sessionCookie, "", -1))
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}
