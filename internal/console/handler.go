package console

import (
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"
)

//go:embed static
var staticFS embed.FS

var loginPage = template.Must(template.ParseFS(staticFS, "static/login.html"))

// CSP is the Content-Security-Policy of every console response: nothing
// from elsewhere, no inline script or style, no framing.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"font-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

// SecureHeaders sets the console's security headers on every response of
// h (the daemon wraps its TCP and console listeners in it: API answers
// get them too, harmlessly for non-browser clients). Only the embedded
// static assets may be cached (revalidated); HTML and API answers are
// never stored.
func SecureHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", CSP)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "same-origin")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Cross-Origin-Opener-Policy", "same-origin")
		if p := r.URL.Path; strings.HasPrefix(p, "/ui/static/") && (strings.HasSuffix(p, ".js") || strings.HasSuffix(p, ".mjs") || strings.HasSuffix(p, ".css")) {
			hd.Set("Cache-Control", "no-cache")
		} else {
			hd.Set("Cache-Control", "no-store")
		}
		h.ServeHTTP(w, r)
	})
}

// Handler serves /ui and everything under it.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	sub, _ := fs.Sub(staticFS, "static")
	files := http.StripPrefix("/ui/static/", http.FileServer(http.FS(sub)))
	mux.Handle("GET /ui/static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The login template is not a static file.
		if path.Base(r.URL.Path) == "login.html" || strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r)
			return
		}
		files.ServeHTTP(w, r)
	}))
	mux.HandleFunc("GET /ui/login", c.loginForm)
	mux.HandleFunc("POST /ui/login", c.login)
	mux.HandleFunc("POST /ui/logout", c.logout)
	mux.HandleFunc("GET /ui/session", c.sessionInfo)
	mux.HandleFunc("GET /ui/{$}", c.index)
	mux.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/ui/", http.StatusSeeOther)
	})
	mux.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such console page: the console is at /ui/", http.StatusNotFound)
	})
	return SecureHeaders(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Not on a sandbox's name: its guest's pages would share the
		// console's cookies (cookies ignore ports).
		if c.foreign(r) {
			http.Error(w, "the console is not served on the sandboxes' ingress names: open it at the daemon's API address", http.StatusMisdirectedRequest)
			return
		}
		mux.ServeHTTP(w, r)
	}))
}

func (c *Console) index(w http.ResponseWriter, r *http.Request) {
	if s, _ := c.session(r); s == nil {
		http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
		return
	}
	b, err := staticFS.ReadFile("static/index.html")
	if err != nil {
		http.Error(w, "console page missing", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(b)
}

func (c *Console) renderLogin(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_ = loginPage.Execute(w, struct{ Error string }{msg})
}

// setCookie sets (or with an empty value clears) the session cookie.
func setCookie(w http.ResponseWriter, value string) {
	ck := &http.Cookie{Name: CookieName, Value: value, Path: "/", HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode}
	if value == "" {
		ck.MaxAge = -1
	}
	http.SetCookie(w, ck)
}

// loginForm shows the login form, or exchanges a one-time token from
// `cagebox console` for an admin session and redirects to a clean URL.
func (c *Console) loginForm(w http.ResponseWriter, r *http.Request) {
	t := r.URL.Query().Get("token")
	if t == "" {
		c.renderLogin(w, http.StatusOK, "")
		return
	}
	addr := clientAddr(r)
	if ok, wait := c.loginAllowed(addr); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds())+1))
		c.renderLogin(w, http.StatusTooManyRequests, "Too many failed logins from your address: wait a little and try again.")
		return
	}
	if err := c.redeem(t, Origin(r)); err != nil {
		c.loginFailed(addr)
		c.cfg.Log.Warn("console: one-time login refused", "client", addr, "err", err)
		c.renderLogin(w, http.StatusUnauthorized, capitalize(err.Error())+".")
		return
	}
	c.loginSucceeded(addr)
	id, _ := c.newSession(c.cfg.AdminTenant, nil, Origin(r), addr)
	setCookie(w, id)
	c.cfg.Log.Info("console: admin session from a one-time link", "client", addr)
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// login takes an API key from a POSTed form (never from the URL).
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	// A login from another site's form would log the browser in as the
	// attacker (login CSRF).
	if o := r.Header.Get("Origin"); o != "" && o != Origin(r) {
		c.renderLogin(w, http.StatusForbidden, "Cross-origin login refused.")
		return
	}
	addr := clientAddr(r)
	if ok, wait := c.loginAllowed(addr); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds())+1))
		c.renderLogin(w, http.StatusTooManyRequests, fmt.Sprintf("Too many failed logins from your address: try again in %s.", wait.Round(time.Second)))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	if err := r.ParseForm(); err != nil {
		c.renderLogin(w, http.StatusBadRequest, "Send the login form (an API key, at most 4 KiB).")
		return
	}
	if r.URL.Query().Has("key") {
		c.renderLogin(w, http.StatusBadRequest, "An API key never goes in a URL: type it into the form.")
		return
	}
	key := strings.TrimSpace(r.PostForm.Get("key"))
	if key == "" {
		c.renderLogin(w, http.StatusBadRequest, "Type an API key (cbk_…): `cagebox tenant key TENANT` makes one.")
		return
	}
	h := c.cfg.HashKey(key)
	tenant, err := c.cfg.Lookup(r.Context(), h)
	if err != nil {
		c.loginFailed(addr)
		c.cfg.Log.Warn("console: login refused", "client", addr)
		c.renderLogin(w, http.StatusUnauthorized, "Unknown or revoked API key.")
		return
	}
	c.loginSucceeded(addr)
	if ok, wait := c.okAllowed(h, addr); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds())+1))
		c.cfg.Log.Warn("console: login throttled", "tenant", tenant, "client", addr)
		c.renderLogin(w, http.StatusTooManyRequests, fmt.Sprintf("Too many logins with this key or from your address: try again in %s (or keep using the session you have).", wait.Round(time.Second)))
		return
	}
	id, _ := c.newSession(tenant, h, Origin(r), addr)
	setCookie(w, id)
	c.cfg.Log.Info("console: login", "tenant", tenant, "client", addr)
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	s, _ := c.session(r)
	if s != nil {
		// The form posts the token as a field.
		if r.Header.Get("X-CSRF-Token") == "" {
			r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
			if err := r.ParseForm(); err == nil {
				r.Header.Set("X-CSRF-Token", r.PostForm.Get("csrf"))
			}
		}
		if err := checkCSRF(r, s); err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		c.endSession(r)
	}
	setCookie(w, "")
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// SessionInfo is what GET /ui/session answers: who the console acts as,
// and the CSRF token its state-changing requests carry.
type SessionInfo struct {
	Tenant    string    `json:"tenant"`
	Admin     bool      `json:"admin"`
	CSRF      string    `json:"csrf"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (c *Console) sessionInfo(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	s, err := c.session(r)
	if s == nil {
		msg := "not logged in: log in at /ui/login"
		if err != nil {
			msg = err.Error()
		}
		w.WriteHeader(http.StatusUnauthorized)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": msg, "kind": "unauthorized"})
		return
	}
	if s.keyHash != nil {
		if t, err := c.cfg.Lookup(r.Context(), s.keyHash); err != nil || t != s.tenant {
			c.endSession(r)
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "the API key of this session was revoked: log in again", "kind": "unauthorized"})
			return
		}
	}
	_ = json.NewEncoder(w).Encode(SessionInfo{Tenant: s.tenant, Admin: s.tenant == c.cfg.AdminTenant, CSRF: s.csrf,
		ExpiresAt: s.created.Add(c.cfg.MaxAge).UTC()})
}

// LoginURL is the URL a one-time token opens.
func LoginURL(origin, token string) string {
	return origin + "/ui/login?token=" + url.QueryEscape(token)
}
