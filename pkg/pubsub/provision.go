package pubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// Provision makes the project match t: it creates what is missing and
// updates mutable settings that drifted (ack deadline, retention, retry
// policy, dead-letter policy, expiration). It returns one line per change; a
// second run returns none.
//
// A server that does not implement an update (codes.Unimplemented: Google's
// Cloud SDK emulator has no UpdateTopic, and does not echo every field it is
// given, so a setting it was created with can read back as drifted) is not an
// error: the resource exists, its drift is reported in a line starting
// "left as is: " and provisioning goes on, so that running it again against a
// running emulator (a second `docker compose up`) succeeds. Real Pub/Sub
// implements every update, so there the line never appears. Settings Pub/Sub cannot change in place (a
// subscription's topic, message ordering) are reported as an error and left
// alone: fixing them means deleting the subscription, which drops its
// unacked messages, so that is an operator's decision (runbook), never
// automatic.
//
// On real GCP, dead-letter forwarding additionally needs the Pub/Sub service
// agent (service-<project-number>@gcp-sa-pubsub.iam.gserviceaccount.com) to
// hold roles/pubsub.publisher on each dead-letter topic and
// roles/pubsub.subscriber on each consumer subscription; that is project IAM
// (Terraform), outside this function.
func Provision(ctx context.Context, c *gpubsub.Client, t Topology) (changes []string, err error) {
	if c == nil {
		return nil, errors.New("pubsub: provision: nil client")
	}
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("pubsub: provision: invalid topology: %w", err)
	}
	project := c.Project()
	for _, tp := range t.Topics {
		change, err := provisionTopic(ctx, c, project, tp)
		if err != nil {
			return changes, fmt.Errorf("pubsub: provision topic %q: %w", tp.ID, err)
		}
		if change != "" {
			changes = append(changes, change)
		}
	}
	for _, s := range t.Subscriptions {
		change, err := provisionSubscription(ctx, c, project, s)
		if err != nil {
			return changes, fmt.Errorf("pubsub: provision subscription %q: %w", s.ID, err)
		}
		if change != "" {
			changes = append(changes, change)
		}
	}
	return changes, nil
}

// ProvisionCommand is the `provision` subcommand of every service binary:
// connect with cfg, provision topo (the whole system's), log each change.
func ProvisionCommand(ctx context.Context, cfg ClientConfig, topo Topology, logger *slog.Logger) error {
	if logger == nil {
		return errors.New("pubsub: provision: nil logger")
	}
	c, err := NewClient(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }() // nothing left to flush: provisioning is synchronous
	changes, err := Provision(ctx, c, topo)
	for _, ch := range changes {
		if kept, ok := strings.CutPrefix(ch, keptPrefix); ok {
			logger.WarnContext(ctx, "pubsub topology drift left as is: the server cannot update it", "drift", kept, "project", c.Project())
			continue
		}
		logger.InfoContext(ctx, "pubsub topology changed", "change", ch, "project", c.Project())
	}
	if err != nil {
		return err
	}
	logger.InfoContext(ctx, "pubsub topology provisioned", "project", c.Project(),
		"emulator", cfg.EmulatorHost, "changes", len(changes))
	return nil
}

// TopicName and SubscriptionName return the full resource names.
func TopicName(project, id string) string { return "projects/" + project + "/topics/" + id }

// SubscriptionName returns "projects/<project>/subscriptions/<id>".
func SubscriptionName(project, id string) string {
	return "projects/" + project + "/subscriptions/" + id
}

// keptPrefix starts the line of a drift the server cannot update (Provision).
const keptPrefix = "left as is: "

func provisionTopic(ctx context.Context, c *gpubsub.Client, project string, tp Topic) (string, error) {
	want := &pubsubpb.Topic{Name: TopicName(project, tp.ID)}
	if tp.MessageRetention > 0 {
		want.MessageRetentionDuration = durationpb.New(tp.MessageRetention)
	}
	got, err := c.TopicAdminClient.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: want.Name})
	if status.Code(err) == codes.NotFound {
		if _, err := c.TopicAdminClient.CreateTopic(ctx, want); err != nil && status.Code(err) != codes.AlreadyExists {
			return "", err
		}
		return "created topic " + tp.ID, nil
	}
	if err != nil {
		return "", err
	}
	if durationOf(got.GetMessageRetentionDuration()) == tp.MessageRetention {
		return "", nil
	}
	drift := fmt.Sprintf("topic %s: message_retention_duration %v -> %v", tp.ID,
		durationOf(got.GetMessageRetentionDuration()), tp.MessageRetention)
	_, err = c.TopicAdminClient.UpdateTopic(ctx, &pubsubpb.UpdateTopicRequest{
		Topic:      want,
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"message_retention_duration"}},
	})
	if status.Code(err) == codes.Unimplemented {
		return keptPrefix + drift + " (UpdateTopic unimplemented)", nil
	}
	if err != nil {
		return "", err
	}
	return "updated " + drift, nil
}

func (s Subscription) proto(project string) *pubsubpb.Subscription {
	p := &pubsubpb.Subscription{
		Name:                     SubscriptionName(project, s.ID),
		Topic:                    TopicName(project, s.Topic),
		AckDeadlineSeconds:       int32(s.AckDeadline / time.Second),
		MessageRetentionDuration: durationpb.New(s.MessageRetention),
		EnableMessageOrdering:    s.EnableOrdering,
		// An expiration policy without a TTL means "never expire". Without
		// it real Pub/Sub deletes a subscription after 31 days without
		// subscriber activity, and with it every message published since:
		// a consumer service that is down for a month must not lose its
		// subscription.
		ExpirationPolicy: &pubsubpb.ExpirationPolicy{},
	}
	if s.RetryMinBackoff != 0 || s.RetryMaxBackoff != 0 {
		p.RetryPolicy = &pubsubpb.RetryPolicy{
			MinimumBackoff: durationpb.New(s.RetryMinBackoff),
			MaximumBackoff: durationpb.New(s.RetryMaxBackoff),
		}
	}
	if s.DeadLetterTopic != "" {
		p.DeadLetterPolicy = &pubsubpb.DeadLetterPolicy{
			DeadLetterTopic:     TopicName(project, s.DeadLetterTopic),
			MaxDeliveryAttempts: int32(s.MaxDeliveryAttempts),
		}
	}
	return p
}

func provisionSubscription(ctx context.Context, c *gpubsub.Client, project string, s Subscription) (string, error) {
	want := s.proto(project)
	got, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: want.Name})
	if status.Code(err) == codes.NotFound {
		if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, want); err != nil && status.Code(err) != codes.AlreadyExists {
			return "", err
		}
		return "created subscription " + s.ID, nil
	}
	if err != nil {
		return "", err
	}
	if got.GetTopic() != want.Topic || got.GetEnableMessageOrdering() != want.EnableMessageOrdering {
		return "", fmt.Errorf("exists with topic %q, ordering %v; declared %q, ordering %v; these cannot change in place: "+
			"delete and re-create the subscription (drops its unacked messages) per the runbook",
			got.GetTopic(), got.GetEnableMessageOrdering(), want.Topic, want.EnableMessageOrdering)
	}
	paths := subscriptionDrift(got, want)
	if len(paths) == 0 {
		return "", nil
	}
	_, err = c.SubscriptionAdminClient.UpdateSubscription(ctx, &pubsubpb.UpdateSubscriptionRequest{
		Subscription: want,
		UpdateMask:   &fieldmaskpb.FieldMask{Paths: paths},
	})
	if status.Code(err) == codes.Unimplemented {
		return fmt.Sprintf("%ssubscription %s: %v (UpdateSubscription unimplemented)", keptPrefix, s.ID, paths), nil
	}
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("updated subscription %s: %v", s.ID, paths), nil
}

// subscriptionDrift lists the update-mask paths whose values differ.
func subscriptionDrift(got, want *pubsubpb.Subscription) []string {
	var paths []string
	if got.GetAckDeadlineSeconds() != want.GetAckDeadlineSeconds() {
		paths = append(paths, "ack_deadline_seconds")
	}
	if durationOf(got.GetMessageRetentionDuration()) != durationOf(want.GetMessageRetentionDuration()) {
		paths = append(paths, "message_retention_duration")
	}
	if !sameRetry(got.GetRetryPolicy(), want.GetRetryPolicy()) {
		paths = append(paths, "retry_policy")
	}
	if got.GetDeadLetterPolicy().GetDeadLetterTopic() != want.GetDeadLetterPolicy().GetDeadLetterTopic() ||
		got.GetDeadLetterPolicy().GetMaxDeliveryAttempts() != want.GetDeadLetterPolicy().GetMaxDeliveryAttempts() {
		paths = append(paths, "dead_letter_policy")
	}
	if got.GetExpirationPolicy() == nil || durationOf(got.GetExpirationPolicy().GetTtl()) != durationOf(want.GetExpirationPolicy().GetTtl()) {
		paths = append(paths, "expiration_policy")
	}
	slices.Sort(paths)
	return paths
}

func sameRetry(a, b *pubsubpb.RetryPolicy) bool {
	if (a == nil) != (b == nil) {
		return false
	}
	return durationOf(a.GetMinimumBackoff()) == durationOf(b.GetMinimumBackoff()) &&
		durationOf(a.GetMaximumBackoff()) == durationOf(b.GetMaximumBackoff())
}

func durationOf(d *durationpb.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.AsDuration()
}
