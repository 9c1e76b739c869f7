DROP TABLE console_sessions;
DROP TABLE notification_deliveries;
DROP TRIGGER audit_events_notify ON audit_events;
DROP FUNCTION toolsvc_queue_notification();
DROP TABLE notification_outbox;
