package auth

// ThrottleTableSize is how many client addresses a's throttle tracks.
func ThrottleTableSize(a *Authenticator) int {
	a.throttle.mu.Lock()
	defer a.throttle.mu.Unlock()
	return len(a.throttle.seen)
}
