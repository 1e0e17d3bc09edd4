package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/textproto"
	"net/url"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// HTTPSpec says what request an HTTP executor sends: the http fields of a
// task's executor.
type HTTPSpec struct {
	// URL is an absolute http or https URL.
	URL string
	// Method is the request method; empty means POST.
	Method string
	// Headers are sent with every request. Names must be valid header names
	// and values free of control characters but tab. Idempotency-Key and
	// Shardcron-* are set by the executor and replace any given here; a Host
	// header sets the request's Host.
	Headers map[string]string
	// Body is the request body; empty sends none.
	Body string
	// UserAgent is the User-Agent sent when Headers set none; empty means
	// "shardcron/<version>", the version of the shardcron module in the
	// running binary's build information ("dev" when it has none).
	UserAgent string
}

// The headers every request carries, in canonical form.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderTask           = "Shardcron-Task"
	HeaderScheduledAt    = "Shardcron-Scheduled-At"
	HeaderAttempt        = "Shardcron-Attempt"
	HeaderNode           = "Shardcron-Node"
	HeaderFence          = "Shardcron-Fence"
)

const (
	// maxDrain is how much of a response body is read before closing it, so
	// that the connection can be reused; past it the connection is closed
	// instead, to bound the time a fire spends on a body nobody reads.
	maxDrain = 64 << 10
	// maxErrorBody is how much of a failed response's body its error quotes.
	maxErrorBody = 256
)

// modulePath is the module whose version goes into the User-Agent.
const modulePath = "github.com/shardcron/shardcron"

// defaultUserAgent is "shardcron/<version>", from the build information.
var defaultUserAgent = sync.OnceValue(func() string {
	version := "dev"
	if bi, ok := debug.ReadBuildInfo(); ok {
		v := bi.Main.Version
		if bi.Main.Path != modulePath {
			v = ""
			for _, d := range bi.Deps {
				if d.Path == modulePath {
					v = d.Version
				}
			}
		}
		if v != "" && v != "(devel)" {
			version = strings.TrimPrefix(v, "v")
		}
	}
	return "shardcron/" + version
})

// StatusError is the error of an HTTP fire answered with a status other than
// 2xx.
type StatusError struct {
	// Code is the status code, e.g. 503.
	Code int
	// Status is the code and reason, e.g. "503 Service Unavailable", the
	// reason on one line as Body is.
	Status string
	// Location is the Location header of a 3xx answer (not followed).
	Location string
	// Body is the start of the response body, at most 256 bytes, as valid
	// UTF-8 on one line: whitespace runs become one space and other control
	// characters U+FFFD. "…" ends it when the body was longer.
	Body string
}

// Error returns e.g. `http: 503 Service Unavailable: {"error":"overloaded"}`.
func (e *StatusError) Error() string {
	var b strings.Builder
	b.WriteString("http: ")
	b.WriteString(e.Status)
	if e.Location != "" {
		fmt.Fprintf(&b, " (redirect to %q not followed)", e.Location)
	}
	if e.Body != "" {
		b.WriteString(": ")
		b.WriteString(e.Body)
	}
	return b.String()
}

// httpExec is an HTTP executor. Its fields are set by NewHTTP and never
// modified after, so Execute may run concurrently.
type httpExec struct {
	client  *http.Client
	method  string
	url     *url.URL    // copied per request: a RoundTripper may modify it
	host    string      // Request.Host: the task's Host header, or "" for url.Host
	header  http.Header // canonical task headers and User-Agent, without ours
	nvals   int         // number of values in header
	body    string
	getBody func() (io.ReadCloser, error) // nil when body is empty
}

// NewHTTP returns an executor that sends the request spec describes through
// client, which all HTTP executors of a node share (see NewClient). It
// parses and checks the spec once: an invalid URL, method or header is an
// error wrapping ErrInvalidSpec, and so is a nil client. When the client has
// an allow-list (ClientConfig.Allow), a URL whose host it leaves out
// whatever DNS answers is an error wrapping ErrNotAllowed.
func NewHTTP(client *http.Client, spec HTTPSpec) (Executor, error) {
	if client == nil {
		return nil, invalidSpec("http: nil *http.Client")
	}
	if err := spec.check(false); err != nil {
		return nil, err
	}
	u, _ := url.Parse(spec.URL) // check parsed it
	if at, ok := client.Transport.(*allowTransport); ok {
		if err := at.allow.CheckURL(spec.URL); err != nil {
			return nil, err
		}
	}
	method := spec.Method
	if method == "" {
		method = http.MethodPost
	}
	e := &httpExec{client: client, method: method, url: u, body: spec.Body}
	if spec.Body != "" {
		body := spec.Body
		e.getBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body)), nil }
	}
	e.header = make(http.Header, len(spec.Headers)+1)
	// Sorted, so that names equal but for case merge in a stable order.
	for _, name := range slices.Sorted(maps.Keys(spec.Headers)) {
		value := spec.Headers[name]
		key := textproto.CanonicalMIMEHeaderKey(name)
		switch {
		case reserved(key):
			continue // ours win; Execute sets them
		case key == "Host":
			e.host = value
			continue // Go ignores Header["Host"]; Request.Host is sent
		}
		e.header[key] = append(e.header[key], value)
		e.nvals++
	}
	if _, ok := e.header["User-Agent"]; !ok {
		ua := spec.UserAgent
		if ua == "" {
			ua = defaultUserAgent()
		}
		e.header["User-Agent"] = []string{ua}
		e.nvals++
	}
	return e, nil
}

// reserved reports whether the canonical header name is one the executor
// sets itself.
func reserved(key string) bool {
	return key == HeaderIdempotencyKey || strings.HasPrefix(key, "Shardcron-")
}

// Execute sends the request once: nil for a 2xx answer, a *StatusError for
// another status, an error wrapping ctx.Err() when ctx ended first, or the
// transport's error (connection refused, TLS, ...).
func (e *httpExec) Execute(ctx context.Context, f *Fire) error {
	if ctx.Err() != nil {
		return notStarted(ctx, "http", "request not sent")
	}
	resp, err := e.client.Do(e.request(ctx, f))
	if err != nil {
		if ctx.Err() != nil {
			return interrupted(ctx, "http", "")
		}
		// url.Error repeats the method and URL, which the task already says.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("http: %w", err)
	}
	defer resp.Body.Close()
	var body io.Reader = resp.Body
	if f.Output != nil {
		body = io.TeeReader(resp.Body, f.Output) // the capture: Output never fails a write
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		// The answer is in: a failure while draining does not change it.
		_, _ = io.CopyN(io.Discard, body, maxDrain)
		return nil
	}
	return statusError(resp, body)
}

// request builds the fire's request: the task's headers plus ours.
func (e *httpExec) request(ctx context.Context, f *Fire) *http.Request {
	v := f.values()
	h := make(http.Header, len(e.header)+6)
	// One backing array for every header value, sliced with capacity 1 per
	// value so that nobody's append can overwrite a neighbour.
	vals := make([]string, 0, e.nvals+6)
	for k, vs := range e.header {
		i := len(vals)
		vals = append(vals, vs...)
		h[k] = vals[i:len(vals):len(vals)]
	}
	set := func(k, s string) {
		vals = append(vals, s)
		n := len(vals)
		h[k] = vals[n-1 : n : n]
	}
	set(HeaderIdempotencyKey, v.key)
	set(HeaderTask, f.TaskID)
	set(HeaderScheduledAt, v.scheduledAt)
	set(HeaderAttempt, v.attempt)
	set(HeaderNode, f.Node)
	set(HeaderFence, v.fence)

	u := *e.url
	r := http.Request{
		Method:     e.method,
		URL:        &u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     h,
		Host:       e.host,
	}
	if f.Body != nil {
		// A trigger's override replaces the task's body for this fire.
		if body := *f.Body; body != "" {
			getBody := func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body)), nil }
			r.Body, _ = getBody()
			r.GetBody = getBody
			r.ContentLength = int64(len(body))
		}
	} else if e.getBody != nil {
		r.Body, _ = e.getBody()
		r.GetBody = e.getBody
		r.ContentLength = int64(len(e.body))
	}
	return r.WithContext(ctx)
}

// statusError reads the start of a failed response's body (read from
// body) into its error, and drains a bounded amount more so the
// connection can be reused.
func statusError(resp *http.Response, body io.Reader) error {
	code := strconv.Itoa(resp.StatusCode)
	// The reason phrase is the target's: any byte but a line break, escape
	// sequences included. Quoted in the history and on terminals, it is
	// made one line of text as the body is.
	reason := oneLine([]byte(strings.TrimSpace(strings.TrimPrefix(resp.Status, code))), false)
	if reason == "" {
		reason = http.StatusText(resp.StatusCode)
	}
	se := &StatusError{Code: resp.StatusCode, Status: strings.TrimSpace(code + " " + reason)}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		se.Location = resp.Header.Get("Location")
	}
	buf := make([]byte, maxErrorBody+1)
	n, _ := io.ReadFull(body, buf)
	se.Body = oneLine(buf[:min(n, maxErrorBody)], n > maxErrorBody)
	_, _ = io.CopyN(io.Discard, body, maxDrain)
	return se
}

// oneLine makes b fit on one line of an error message.
func oneLine(b []byte, truncated bool) string {
	var sb strings.Builder
	space := false
	for len(b) > 0 {
		if truncated && !utf8.FullRune(b) {
			break // a rune cut by the truncation, not invalid input
		}
		r, size := utf8.DecodeRune(b)
		b = b[size:]
		switch {
		case unicode.IsSpace(r):
			space = true
			continue
		case unicode.IsControl(r):
			r = utf8.RuneError
		}
		if space && sb.Len() > 0 {
			sb.WriteByte(' ')
		}
		space = false
		sb.WriteRune(r)
	}
	if truncated {
		sb.WriteString("…")
	}
	return sb.String()
}

// isToken reports whether s is an HTTP token (RFC 9110): a method or header
// name.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
