package web

// LimitKey exposes limitKey to the tests.
var LimitKey = limitKey
