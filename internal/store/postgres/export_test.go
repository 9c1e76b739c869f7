package postgres

// ListenerPID exposes, to this package's external tests, the backend pid of
// the Store's listening connection (0 before the first Subscribe).
func ListenerPID(s *Store) uint32 { return s.listener.listenerPID() }

// QueuedStatements returns how many statements wait for a shared commit.
func QueuedStatements(s *Store) int {
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	return len(s.group.queue)
}

// KnownMigrationCount is how many migrations this binary embeds (their
// versions may skip a number: see TestEmbeddedMigrations).
func KnownMigrationCount() (int, error) {
	known, err := knownMigrations()
	return len(known), err
}
