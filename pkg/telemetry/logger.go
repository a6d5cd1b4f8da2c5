package telemetry

import (
	"context"
	"io"
	"log/slog"
	"sync"

	"go.opentelemetry.io/otel/trace"
)

// NewLogger returns a JSON slog logger whose records carry trace_id and
// span_id when logged with a context that holds a span (use the *Context
// methods: logger.InfoContext(ctx, ...)).
func NewLogger(out io.Writer, level slog.Leveler) *slog.Logger {
	return newLogger(out, level, LogFormatJSON, "")
}

// newLogger returns the logger of a validated format; project names the
// traces of gcp lines.
func newLogger(out io.Writer, level slog.Leveler, format, project string) *slog.Logger {
	switch format {
	case LogFormatText:
		return slog.New(traceHandler{Handler: slog.NewTextHandler(out, &slog.HandlerOptions{Level: level})})
	case LogFormatGCP:
		h := slog.NewJSONHandler(out, &slog.HandlerOptions{Level: level, AddSource: true, ReplaceAttr: gcpField})
		return slog.New(traceHandler{Handler: h, gcpProject: project})
	default:
		return slog.New(traceHandler{Handler: slog.NewJSONHandler(out, &slog.HandlerOptions{Level: level})})
	}
}

// Cloud Logging's special JSON fields
// (cloud.google.com/logging/docs/structured-logging).
const (
	gcpTrace          = "logging.googleapis.com/trace"
	gcpSpanID         = "logging.googleapis.com/spanId"
	gcpTraceSampled   = "logging.googleapis.com/trace_sampled"
	gcpSourceLocation = "logging.googleapis.com/sourceLocation"
)

// gcpField renames slog's built-in keys to Cloud Logging's. slog's time is
// already "time" in RFC 3339, which Cloud Logging reads.
func gcpField(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 {
		return a
	}
	switch a.Key {
	case slog.LevelKey:
		l, _ := a.Value.Any().(slog.Level)
		return slog.String("severity", severity(l))
	case slog.MessageKey:
		a.Key = "message"
	case slog.SourceKey:
		// slog.Source marshals as {function, file, line}, the fields of
		// Cloud Logging's LogEntrySourceLocation.
		a.Key = gcpSourceLocation
	}
	return a
}

// severity maps slog levels, including those between the named ones, to the
// Cloud Logging severity at or below them.
func severity(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "ERROR"
	case l >= slog.LevelWarn:
		return "WARNING"
	case l >= slog.LevelInfo:
		return "INFO"
	default:
		return "DEBUG"
	}
}

// traceHandler adds the span of the record's context: trace_id and span_id,
// or with gcpProject set Cloud Logging's trace fields. They are added to the
// record, so under a logger.WithGroup they would land inside the group,
// where Cloud Logging does not look; the services log no groups.
type traceHandler struct {
	slog.Handler
	gcpProject string
}

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		if h.gcpProject != "" {
			r.AddAttrs(
				slog.String(gcpTrace, "projects/"+h.gcpProject+"/traces/"+sc.TraceID().String()),
				slog.String(gcpSpanID, sc.SpanID().String()),
				slog.Bool(gcpTraceSampled, sc.IsSampled()))
		} else {
			r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	return traceHandler{&lazyAttrs{parent: h.Handler, attrs: attrs}, h.gcpProject}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name), h.gcpProject}
}

// lazyAttrs defers slog's WithAttrs to the first record that passes the
// level. The JSON and text handlers encode the attributes at once, which
// for a per-order logger.With (a job's or an event's ids) cost more than
// the DEBUG lines it serves when they are off. Values are resolved when the
// first line is written rather than at With: the services pass immutable
// values (ids, strings, numbers).
type lazyAttrs struct {
	parent slog.Handler
	attrs  []slog.Attr
	once   sync.Once
	h      slog.Handler
}

func (l *lazyAttrs) handler() slog.Handler {
	l.once.Do(func() {
		p := l.parent
		if lp, ok := p.(*lazyAttrs); ok { // a With of a With: its parent's, encoded once
			p = lp.handler()
		}
		l.h = p.WithAttrs(l.attrs)
	})
	return l.h
}

// Enabled asks the parent: WithAttrs does not change a handler's level.
func (l *lazyAttrs) Enabled(ctx context.Context, level slog.Level) bool {
	return l.parent.Enabled(ctx, level)
}

func (l *lazyAttrs) Handle(ctx context.Context, r slog.Record) error {
	return l.handler().Handle(ctx, r)
}

func (l *lazyAttrs) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &lazyAttrs{parent: l, attrs: attrs}
}

func (l *lazyAttrs) WithGroup(name string) slog.Handler {
	return l.handler().WithGroup(name)
}
